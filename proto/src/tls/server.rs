//! The server side: a rustls configuration that follows the TLS directory ([`Tls::current`]
//! on every handshake), and an accept loop that hands tonic finished TLS connections.
//!
//! Handshakes run concurrently (a slow or hostile client holds one task for at most
//! [`HANDSHAKE_TIMEOUT`], never the accept loop), at most [`MAX_HANDSHAKES`] at once; a
//! refused handshake (expired certificate, another CA, plaintext) is logged with the peer's
//! address and the reason, and the connection closed.

use super::TlsError;
use super::material::{Tls, provider};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// Longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress on one listener.
pub const MAX_HANDSHAKES: usize = 256;

#[derive(Debug)]
struct Resolver(Arc<Tls>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current().certified.clone()
    }
}

#[derive(Debug)]
struct Verifier(Arc<Tls>);

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        // A client may come with a bearer token instead; the services refuse a call that has
        // neither.
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, tokio_rustls::rustls::Error> {
        self.0.current().client_verifier.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.0.current().client_verifier.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.0.current().client_verifier.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().client_verifier.supported_verify_schemes()
    }
}

/// A server configuration over `tls` offering the ALPN protocols `alpn` (gRPC: `h2`). The
/// directory must hold a certificate.
pub fn server_config(tls: &Arc<Tls>, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, TlsError> {
    if tls.current().certified.is_none() {
        return Err(TlsError::Config(format!(
            "{} has no cert.pem and key.pem: a server needs its own certificate (tessera tls issue)",
            tls.dir().display()
        )));
    }
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(Arc::new(Verifier(tls.clone())))
        .with_cert_resolver(Arc::new(Resolver(tls.clone())));
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// Connections accepted on `listener`, each after a successful handshake, with TCP_NODELAY.
/// The loop ends when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p,
                () = tx.closed() => return,
            };
            let Ok(permit) = permit else { return };
            let (tcp, peer) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: wait a moment rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => {
                        let _ = tx.send(Ok(s)).await;
                    }
                    Ok(Err(e)) => tracing::warn!(%peer, error = %e, "TLS handshake refused"),
                    Err(_) => tracing::warn!(%peer, "TLS handshake not finished within 10 s; closed"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
