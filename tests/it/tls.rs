//! HTTPS on the listener (SPEC §9): certificates made by the test (rcgen, a
//! CA and a leaf; openssl for the RSA and SEC1 key formats), signed provider
//! deliveries over TLS 1.2 and 1.3 with duplicates replayed, and every
//! unusable cert or key a config error with its position.

use crate::common;
use crate::core_util::read_response_text;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use idemgate::verify::sign;
use rustls::pki_types::{CertificateDer, ServerName};

const SECRET: &str = "tls-github-secret";

fn tls_routes(up: &str, cert: &Path, key: &Path) -> String {
    format!(
        "  - name: gh\n    match:\n      path_prefix: /gh\n    upstream: \"{up}\"\n    provider: github\n    verify:\n      secrets: [env:GH_SECRET]\n\
         tls:\n  cert: file:{}\n  key: file:{}\ndownstream:\n  header_timeout: 1s\n",
        cert.display(),
        key.display()
    )
}

/// A TLS client that trusts `ca_pem`, limited to `version`.
fn client(
    ca_pem: &str,
    version: &'static rustls::SupportedProtocolVersion,
    addr: SocketAddr,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        let c: CertificateDer = c.unwrap();
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// One signed GitHub delivery on `s`; (status, head and body text).
fn deliver(s: &mut impl ReadWrite, id: &str, key: &str) -> (u16, String) {
    let body = format!("{{\"action\":\"opened\",\"n\":\"{id}\"}}");
    let sig = sign::github(key.as_bytes(), body.as_bytes());
    let req = format!(
        "POST /gh/hook HTTP/1.1\r\nHost: localhost\r\nX-GitHub-Event: issues\r\nX-GitHub-Delivery: {id}\r\n\
         X-Hub-Signature-256: {sig}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s.flush().unwrap();
    read_response_text(s)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[test]
fn signed_deliveries_over_https_with_duplicates_replayed_on_tls12_and_tls13() {
    let dir = TempDir::new("tls-deliveries");
    let (ca, leaf, key) = certificates();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, &leaf).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("tls.db");
    let px = Proxy::start_with_env(
        &dir,
        &store,
        &tls_routes(&up.url(), &cert_path, &key_path),
        &[("GH_SECRET", SECRET)],
    );
    for (version, name) in [
        (&rustls::version::TLS13, "TLSv1_3"),
        (&rustls::version::TLS12, "TLSv1_2"),
    ] {
        let id = eid(name);
        let mut s = client(&ca, version, px.addr);
        let (status, text) = deliver(&mut s, &id, SECRET);
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("Idempotency-Status: forwarded"), "{text}");
        assert_eq!(
            s.conn.protocol_version().map(|v| format!("{v:?}")),
            Some(name.to_string())
        );
        assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]), "no h2");
        // the duplicate on the same kept-alive TLS connection, and on a new one
        let (status, text) = deliver(&mut s, &id, SECRET);
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("Idempotent-Replayed: true"), "{text}");
        let mut again = client(&ca, version, px.addr);
        let (status, text) = deliver(&mut again, &id, SECRET);
        assert!(
            status == 200 && text.contains("Idempotent-Replayed: true"),
            "{text}"
        );
        // a forgery over TLS is refused before any claim
        let (status, _) = deliver(&mut again, &eid("forged"), "not-the-secret");
        assert_eq!(status, 401);
        assert_eq!(up.count(&id), 1, "one delivery reached the consumer");
        assert_eq!(show(&store, "gh", &id)["state"], "delivered");
    }
    assert_eq!(up.total(), 2);
    // the handshake is part of the head's time: a silent TLS client is closed
    let mut silent = TcpStream::connect(px.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let t = Instant::now();
    let mut b = [0u8; 16];
    assert!(matches!(silent.read(&mut b), Ok(0) | Err(_)));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(
        px.metric("idemgate_connections_closed_total{reason=\"header_timeout\"}"),
        1.0
    );
    // plain HTTP to the HTTPS listener gets no answer
    let mut plain = TcpStream::connect(px.addr).unwrap();
    plain
        .write_all(b"GET /gh HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!got.starts_with(b"HTTP/1.1 200"), "{got:?}");
}

/// A config on `dir`'s SQLite file `db`, one route, and this tls section.
fn tls_config_text(dir: &TempDir, db: &str, cert: &str, key: &str) -> String {
    let route = route("r", "/h", "http://127.0.0.1:9", "");
    let text = config_text(free_port(), free_port(), &dir.sqlite_url(db), &route);
    format!("{text}tls:\n  cert: {cert}\n  key: {key}\n")
}

/// `idemgate check` of a config with this tls section: (exit code, stderr).
fn check_tls(dir: &TempDir, cert: &str, key: &str) -> (i32, String, String) {
    let path = dir.path().join("check.yaml");
    let text = tls_config_text(dir, "c.db", cert, key);
    std::fs::write(&path, text).unwrap();
    let (code, _, err) = cli(&["check", "--config", path.to_str().unwrap()]);
    (code, err, path.display().to_string())
}

fn openssl(args: &[&str]) -> bool {
    std::process::Command::new("openssl")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A self-signed RSA certificate and its key in PKCS#1 (`BEGIN RSA PRIVATE
/// KEY`), as openssl writes them; their paths.
fn openssl_pkcs1_pair(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let rsa_key = dir.path().join("rsa.key");
    let rsa_cert = dir.path().join("rsa.pem");
    assert!(openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-days",
        "1",
        "-keyout",
        rsa_key.to_str().unwrap(),
        "-out",
        rsa_cert.to_str().unwrap(),
    ]));
    let pkcs1 = dir.path().join("rsa1.key");
    assert!(openssl(&[
        "rsa",
        "-in",
        rsa_key.to_str().unwrap(),
        "-traditional",
        "-out",
        pkcs1.to_str().unwrap(),
    ]));
    assert!(std::fs::read_to_string(&pkcs1)
        .unwrap()
        .contains("BEGIN RSA PRIVATE KEY"));
    (rsa_cert, pkcs1)
}

#[test]
fn unusable_certificates_and_keys_are_config_errors_with_their_position() {
    let dir = TempDir::new("tls-errors");
    let (_, leaf, key) = certificates();
    let (_, _, other_key) = certificates();
    let p = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        format!("file:{}", path.display())
    };
    let (cert, key_ref) = (p("cert.pem", &leaf), p("key.pem", &key));
    let (code, err, _) = check_tls(&dir, &cert, &key_ref);
    assert_eq!(code, 0, "a good pair: {err}");

    let missing = format!("file:{}", dir.path().join("nope.pem").display());
    let garbage = p("garbage.pem", "not a pem file\n");
    let cases = [
        (missing.clone(), key_ref.clone(), "tls.cert", "cannot read"),
        (cert.clone(), missing.clone(), "tls.key", "cannot read"),
        (
            garbage.clone(),
            key_ref.clone(),
            "tls.cert",
            "no certificate",
        ),
        (cert.clone(), garbage.clone(), "tls.key", "no private key"),
        (
            key_ref.clone(),
            key_ref.clone(),
            "tls.cert",
            "no certificate",
        ),
        (
            cert.clone(),
            p("other.pem", &other_key),
            "tls.key",
            "does not match",
        ),
        (
            "env:CERT".to_string(),
            key_ref.clone(),
            "tls.cert",
            "file:PATH",
        ),
    ];
    for (c, k, path, says) in cases {
        let (code, err, file) = check_tls(&dir, &c, &k);
        assert_eq!(code, 2, "{c} {k}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains(path))
            .unwrap_or_else(|| panic!("{path} in {err}"));
        assert!(
            line.starts_with(&format!("{file}:")),
            "file:line:col: {line}"
        );
        let pos: Vec<&str> = line[file.len() + 1..].splitn(3, ':').collect();
        assert!(
            pos[0].parse::<u32>().is_ok() && pos[1].parse::<u32>().is_ok(),
            "{line}"
        );
        assert!(line.contains(says), "{says}: {line}");
        assert!(
            !line.contains("-----"),
            "no key material in messages: {line}"
        );
    }

    // RSA (PKCS#1) and EC (SEC1) keys, as openssl writes them
    let (rsa_cert, pkcs1) = openssl_pkcs1_pair(&dir);
    let (code, err, _) = check_tls(
        &dir,
        &format!("file:{}", rsa_cert.display()),
        &format!("file:{}", pkcs1.display()),
    );
    assert_eq!(code, 0, "RSA: {err}");
    let sec1 = dir.path().join("ec.key");
    assert!(openssl(&[
        "ec",
        "-in",
        dir.path().join("key.pem").to_str().unwrap(),
        "-out",
        sec1.to_str().unwrap()
    ]));
    assert!(std::fs::read_to_string(&sec1)
        .unwrap()
        .contains("BEGIN EC PRIVATE KEY"));
    let (code, err, _) = check_tls(&dir, &cert, &format!("file:{}", sec1.display()));
    assert_eq!(code, 0, "SEC1: {err}");

    // serve refuses too, before listening
    let path = dir.path().join("serve.yaml");
    let text = tls_config_text(&dir, "s.db", &cert, &p("other2.pem", &other_key));
    std::fs::write(&path, text).unwrap();
    let (code, _, err) = cli(&["serve", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tls.key"), "{err}");
}
