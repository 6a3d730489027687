//! The "under attack" load (issue 19): many connections that each hold a
//! slot as cheaply as an attacker can — idle kept-alive, a head dripped a
//! byte a second, a body dripped a byte a second — held for the whole run:
//! a connection idemgate closes is opened again at once. Every close is
//! timed from the start of what the timeout bounds (the end of the
//! response, the accept, the end of the head).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

pub(crate) mod run;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Idle,
    Head,
    Body,
}

pub const KINDS: [Kind; 3] = [Kind::Idle, Kind::Head, Kind::Body];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Idle => "idle kept-alive",
            Kind::Head => "dripped head",
            Kind::Body => "dripped body",
        }
    }
}

pub struct Settings {
    pub addr: SocketAddr,
    pub connections: usize,
    /// The timeout each kind meets: keep-alive, header, body.
    pub keepalive: Duration,
    pub header: Duration,
    pub body: Duration,
    /// Source addresses (127.0.0.x) for the ephemeral ports.
    pub sources: Vec<Ipv4Addr>,
}

#[derive(Default)]
struct Closes {
    /// Seconds from the start of the bounded phase to idemgate's close.
    after: Vec<f64>,
    /// Closed before the bounded phase began (refused, or cut earlier).
    early: usize,
}

pub struct Attack {
    rt: tokio::runtime::Runtime,
    stop: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    closes: Arc<Mutex<[Closes; 3]>>,
    started: Instant,
    pub settings: Arc<Settings>,
}

impl Attack {
    pub fn start(settings: Settings) -> Attack {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let settings = Arc::new(settings);
        let a = Attack {
            rt,
            stop: Arc::new(AtomicBool::new(false)),
            open: Arc::new(AtomicUsize::new(0)),
            closes: Arc::new(Mutex::new(Default::default())),
            started: Instant::now(),
            settings: settings.clone(),
        };
        for i in 0..settings.connections {
            let kind = KINDS[i % 3];
            let (stop, open, closes, settings) = (
                a.stop.clone(),
                a.open.clone(),
                a.closes.clone(),
                settings.clone(),
            );
            a.rt.spawn(async move {
                let src = settings.sources[i % settings.sources.len()];
                // spread the ramp over ~2 s
                tokio::time::sleep(Duration::from_micros((i as u64 * 200) % 2_000_000)).await;
                while !stop.load(Ordering::Relaxed) {
                    let Some(s) = connect(src, settings.addr).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    open.fetch_add(1, Ordering::Relaxed);
                    let got = hold(s, kind, i, &stop).await;
                    open.fetch_sub(1, Ordering::Relaxed);
                    let mut c = closes.lock().unwrap();
                    match got {
                        Held::Closed(after) => c[kind as usize].after.push(after),
                        Held::Early => c[kind as usize].early += 1,
                        Held::Stopped => {}
                    }
                }
            });
        }
        a
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Stops every attacker; returns the report lines and whether every
    /// close came within its timeout + 1 s.
    pub fn stop(self) -> (Vec<String>, bool) {
        self.stop.store(true, Ordering::Relaxed);
        let elapsed = self.started.elapsed();
        // the tasks notice within their next second
        std::thread::sleep(Duration::from_millis(1500));
        self.rt.shutdown_timeout(Duration::from_secs(2));
        let closes = self.closes.lock().unwrap();
        let mut lines = vec![format!(
            "attack: {} connections held for {:.0} s ({} of each kind, sources {})",
            self.settings.connections,
            elapsed.as_secs_f64(),
            self.settings.connections / 3,
            self.settings
                .sources
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        )];
        let mut ok = true;
        for kind in KINDS {
            let c = &closes[kind as usize];
            let limit = match kind {
                Kind::Idle => self.settings.keepalive,
                Kind::Head => self.settings.header,
                Kind::Body => self.settings.body,
            }
            .as_secs_f64();
            let mut v = c.after.clone();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let q = |p: f64| {
                v.get(((v.len() as f64 - 1.0) * p).round() as usize)
                    .copied()
            };
            let worst = v.last().copied().unwrap_or(0.0);
            let within = worst <= limit + 1.0;
            ok &= within && !v.is_empty();
            lines.push(format!(
                "  {:16} closed by idemgate {:6} times, {:.2} / {:.2} / {:.2} s after their phase began (min / median / max; timeout {limit:.0} s: {}); {} closed before it",
                kind.name(),
                v.len(),
                q(0.0).unwrap_or(0.0),
                q(0.5).unwrap_or(0.0),
                worst,
                if within { "within +1 s" } else { "LATE" },
                c.early,
            ));
        }
        (lines, ok)
    }
}

async fn connect(src: Ipv4Addr, addr: SocketAddr) -> Option<TcpStream> {
    let sock = TcpSocket::new_v4().ok()?;
    sock.bind(SocketAddr::new(IpAddr::V4(src), 0)).ok()?;
    let s = tokio::time::timeout(Duration::from_secs(5), sock.connect(addr))
        .await
        .ok()?
        .ok()?;
    s.set_nodelay(true).ok()?;
    Some(s)
}

enum Held {
    /// Closed by idemgate this many seconds after the bounded phase began.
    Closed(f64),
    Early,
    Stopped,
}

/// Holds one connection the way `kind` does until idemgate closes it.
async fn hold(mut s: TcpStream, kind: Kind, i: usize, stop: &AtomicBool) -> Held {
    let mut buf = [0u8; 4096];
    let began = match kind {
        Kind::Idle => {
            let req = b"GET /pass/attack HTTP/1.1\r\nHost: localhost\r\n\r\n";
            if s.write_all(req).await.is_err() {
                return Held::Early;
            }
            // nginx's "ok\n" with its head
            let mut got = Vec::new();
            while !got.ends_with(b"ok\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return Held::Early,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            Instant::now()
        }
        Kind::Head => {
            let began = Instant::now();
            if s.write_all(b"POST /unique HTTP/1.1\r\nHost: localhost\r\n")
                .await
                .is_err()
            {
                return Held::Early;
            }
            began
        }
        Kind::Body => {
            let head = format!(
                "POST /unique HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: attack-{i}\r\nContent-Length: 1024\r\n\r\n"
            );
            if s.write_all(head.as_bytes()).await.is_err() {
                return Held::Early;
            }
            Instant::now()
        }
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return Held::Closed(began.elapsed().as_secs_f64()),
                Ok(_) => {} // the 408, then the close
            },
            _ = tick.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return Held::Stopped;
                }
                if kind != Kind::Idle && s.write_all(b"x").await.is_err() {
                    return Held::Closed(began.elapsed().as_secs_f64());
                }
            }
        }
    }
}
