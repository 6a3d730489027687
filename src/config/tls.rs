//! The `tls` section: the listener's certificate chain and private key, as
//! `file:` references, read and checked at load so that a file that cannot
//! be read, does not parse or does not belong with the other is a config
//! error with its position (exit 2), not a failure at the first handshake.

use std::path::PathBuf;
use std::sync::Arc;

use pingora::tls::{version, CertificateDer, PrivateKeyDer, ServerConfig};
use rustls_pki_types::pem::PemObject;

use super::ctx::Ctx;
use super::model::Tls;
use super::raw::RawTls;

/// The ALPN protocols the listener offers: HTTP/1.1 only (no h2; see the
/// docs/internet.md).
const ALPN: &[&[u8]] = &[b"http/1.1"];

pub fn tls_config(ctx: &mut Ctx, raw: RawTls) -> Option<Tls> {
    let RawTls { cert, key } = raw;
    let cert_path = file_ref(ctx, "tls.cert", cert.as_deref());
    let key_path = file_ref(ctx, "tls.key", key.as_deref());
    let (cert_path, key_path) = (cert_path?, key_path?);
    let chain = read_chain(&cert_path).map_err(|e| ctx.at_value("tls.cert", e));
    let key = read_key(&key_path).map_err(|e| ctx.at_value("tls.key", e));
    let (chain, key) = (chain.ok()?, key.ok()?);
    match server_config(chain, key) {
        Ok(server_config) => Some(Tls {
            cert_path,
            key_path,
            server_config: Arc::new(server_config),
        }),
        Err(e) => {
            ctx.at_value("tls.key", e);
            None
        }
    }
}

/// `file:PATH` → PATH; anything else is an error at `path`.
fn file_ref(ctx: &mut Ctx, path: &str, value: Option<&str>) -> Option<PathBuf> {
    let Some(value) = value else {
        ctx.at_key(
            "tls",
            format!("required field `{}` is missing (file:PATH)", &path[4..]),
        );
        return None;
    };
    match value.strip_prefix("file:") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        Some(_) => {
            ctx.at_value(path, "`file:` needs a path (file:PATH)");
            None
        }
        None => {
            ctx.at_value(path, "must be a `file:PATH` reference to a PEM file");
            None
        }
    }
}

fn read_chain(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let text =
        std::fs::read(path).map_err(|e| format!("file:{shown}: cannot read the file: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("file:{shown}: not a PEM certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err(format!(
            "file:{shown}: no certificate in it (expected PEM `BEGIN CERTIFICATE` blocks)"
        ));
    }
    Ok(chain)
}

fn read_key(path: &PathBuf) -> Result<PrivateKeyDer<'static>, String> {
    let shown = path.display();
    let text =
        std::fs::read(path).map_err(|e| format!("file:{shown}: cannot read the file: {e}"))?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| {
        format!("file:{shown}: no private key in it (expected PEM PKCS#8, RSA or EC): {e}")
    })
}

/// TLS 1.2 and 1.3 with the process's crypto provider (ring, as pingora
/// installs it); fails when the key is not usable or not the certificate's.
fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig, String> {
    pingora::tls::install_default_crypto_provider();
    let mut config =
        ServerConfig::builder_with_protocol_versions(&[&version::TLS12, &version::TLS13])
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| match e {
                pingora::tls::RusTlsError::InconsistentKeys(_) => {
                    "the private key does not match the certificate (tls.cert's first certificate)"
                        .to_string()
                }
                other => format!("the certificate and key cannot be used together: {other}"),
            })?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}
