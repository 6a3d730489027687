//! A real browser for the console tests: Debian's headless Chromium, driven
//! through chromedriver's W3C WebDriver protocol — plain JSON over HTTP, sent
//! with the project's own blocking client, so no WebDriver crate (and its
//! async stack) joins the dependency tree for the dozen commands used here.
//!
//! Without Chromium the tests print `SKIP`; in CI (`CI` set) they fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, Client, TempDir};

/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where Debian puts the browser and its driver (`apt-get install chromium
/// chromium-driver`). The real binary, not the `/usr/bin/chromium` wrapper
/// script, so that /etc/chromium.d cannot add flags.
const CHROMIUM: &[&str] = &["/usr/lib/chromium/chromium", "/usr/bin/chromium"];
const CHROMEDRIVER: &[&str] = &["/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver"];

fn first_existing(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// The browser and the driver, or `None` after printing why (a test failure in CI).
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    match (first_existing(CHROMIUM), first_existing(CHROMEDRIVER)) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("Chromium or chromedriver is missing, and CI requires the browser tests: apt-get install -y chromium chromium-driver")
        }
        _ => {
            eprintln!(
                "SKIP: the browser tests need Debian's chromium and chromium-driver \
                 (apt-get install -y chromium chromium-driver); test skipped"
            );
            None
        }
    }
}

/// An error answer from the driver: the W3C error code and its message.
#[derive(Debug, Clone)]
pub struct WdError {
    pub error: String,
    #[expect(
        dead_code,
        reason = "read by Debug, in the message of a failed command"
    )]
    pub message: String,
}

/// One chromedriver and one browser session on a fresh profile; both end
/// when this drops.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: TempDir,
    log: PathBuf,
}

/// An element reference.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver and a headless Chromium, `None` when not installed.
    pub fn start() -> Option<Browser> {
        let (chromium, chromedriver) = installed()?;
        let profile = TempDir::new("chromium");
        let port = free_port();
        let log = profile.path().join("chromedriver.log");
        use std::os::unix::process::CommandExt;
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // its own process group: dropping the browser ends chromium too
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
            log,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if b.raw("GET", "/status", None)
                .is_ok_and(|v| v["value"]["ready"] == true)
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver not ready in 20s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let data_dir = b._profile.path().join("profile");
        let args = [
            "--headless".to_string(),
            "--no-sandbox".into(), // root in a container: the sandbox cannot start
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-extensions".into(),
            "--disable-default-apps".into(),
            "--hide-scrollbars".into(),
            "--lang=en-US".into(),
            "--window-size=1280,1000".into(),
            format!("--user-data-dir={}", data_dir.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // an alert stays open for the test to find, instead of being dismissed
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let answer = b
            .raw("POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("no browser session: {e:?}\n{}", b.driver_log()));
        b.session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {answer}\n{}", b.driver_log()))
            .to_string();
        Some(b)
    }

    pub fn driver_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One WebDriver command; `Err` for the driver's error answers.
    fn raw(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, WdError> {
        let io = |e: std::io::Error| WdError {
            error: "io".into(),
            message: e.to_string(),
        };
        let addr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let bytes = body
            .map(|b| serde_json::to_vec(b).unwrap())
            .unwrap_or_default();
        let mut headers = vec![];
        if body.is_some() {
            headers.push(("Content-Type", "application/json; charset=utf-8"));
        }
        let resp = Client::connect(addr)
            .map_err(io)?
            .request(method, path, &headers, &bytes)
            .map_err(io)?;
        let doc: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        if resp.status == 200 {
            Ok(doc)
        } else {
            Err(WdError {
                error: doc["value"]["error"].as_str().unwrap_or("?").to_string(),
                message: doc["value"]["message"].as_str().unwrap_or("").to_string(),
            })
        }
    }

    /// A command in this session; its `value`.
    pub fn cmd(&self, method: &str, path: &str, body: Value) -> Result<Value, WdError> {
        let body = (method == "POST").then_some(body);
        self.raw(
            method,
            &format!("/session/{}{path}", self.session),
            body.as_ref(),
        )
        .map(|mut v| v["value"].take())
    }

    fn must(&self, method: &str, path: &str, body: Value) -> Value {
        self.cmd(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e:?}"))
    }

    pub fn goto(&self, url: &str) {
        self.must("POST", "/url", json!({ "url": url }));
    }

    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let v = self.must(
            "POST",
            "/elements",
            json!({"using": "css selector", "value": css}),
        );
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| Element(e[ELEMENT].as_str().unwrap().to_string()))
            .collect()
    }

    pub fn find(&self, css: &str) -> Option<Element> {
        self.find_all(css).into_iter().next()
    }

    /// Waits for `css` to match a displayed element.
    pub fn wait_visible(&self, css: &str) -> Element {
        self.wait_for(&format!("{css} displayed"), |b| {
            b.find(css).filter(|e| b.displayed(e))
        })
    }

    /// Polls `check` every 100 ms for up to 20 s (the refresh is every 3 s;
    /// CI machines are slow); panics with `what` when it never holds.
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Browser) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = check(self) {
                return v;
            }
            if Instant::now() > deadline {
                let page = self.execute("return document.body.innerText", json!([]));
                panic!("timed out waiting for {what}; the page shows:\n{page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn text(&self, e: &Element) -> String {
        self.must("GET", &format!("/element/{}/text", e.0), Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The rendered text of every element matching `css`, read in one
    /// script so a refresh that replaces them between a find and a read
    /// cannot leave a stale element reference.
    pub fn texts(&self, css: &str) -> Vec<String> {
        let v = self.execute(
            "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText.trim());",
            json!([css]),
        );
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|t| t.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The rendered text of the first element matching `css`, if any (one
    /// script, as [`Browser::texts`]).
    pub fn text_of(&self, css: &str) -> Option<String> {
        self.texts(css).into_iter().next()
    }

    pub fn displayed(&self, e: &Element) -> bool {
        self.cmd("GET", &format!("/element/{}/displayed", e.0), Value::Null)
            .is_ok_and(|v| v == true)
    }

    pub fn click(&self, e: &Element) {
        self.must("POST", &format!("/element/{}/click", e.0), json!({}));
    }

    /// Clicks the displayed element `css` matches, found again if a
    /// redraw replaced it between the find and the click (the overview
    /// redraws every 3 s).
    pub fn click_on(&self, css: &str) {
        for _ in 0..5 {
            let e = self.wait_visible(css);
            match self.cmd("POST", &format!("/element/{}/click", e.0), json!({})) {
                Ok(_) => return,
                Err(e) if e.error == "stale element reference" => continue,
                Err(e) => panic!("click {css}: {e:?}"),
            }
        }
        panic!("click {css}: the element went stale five times");
    }

    pub fn clear(&self, e: &Element) {
        self.must("POST", &format!("/element/{}/clear", e.0), json!({}));
    }

    pub fn type_text(&self, e: &Element, text: &str) {
        self.must(
            "POST",
            &format!("/element/{}/value", e.0),
            json!({ "text": text }),
        );
    }

    /// Runs `script` (a function body) in the page with `args`; its result.
    pub fn execute(&self, script: &str, args: Value) -> Value {
        self.must(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
    }

    /// The text of an open alert, confirm or prompt, if any.
    pub fn alert_text(&self) -> Option<String> {
        match self.cmd("GET", "/alert/text", Value::Null) {
            Ok(v) => Some(v.as_str().unwrap_or_default().to_string()),
            Err(e) if e.error == "no such alert" => None,
            Err(e) => panic!("alert/text: {e:?}"),
        }
    }

    /// A PNG of the viewport, written to `dir/name` when `dir` is given.
    pub fn screenshot(&self, dir: Option<&Path>, name: &str) {
        let Some(dir) = dir else { return };
        use base64::Engine;
        let b64 = self.must("GET", "/screenshot", Value::Null);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
        eprintln!("screenshot: {}", dir.join(name).display());
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.raw("DELETE", &format!("/session/{}", self.session), None);
        }
        // the driver's process group: chromedriver and any browser left over
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
