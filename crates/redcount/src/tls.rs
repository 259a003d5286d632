//! TLS is rustls with its `ring` provider everywhere redcount connects or serves (no
//! OpenSSL): `rediss://` URLs, `https://` REST fronts, and the front's own HTTPS. Trust
//! roots come from the system store; `SSL_CERT_FILE` names another bundle (e.g. a private CA).

/// Makes `ring` the process's rustls provider (the clients ask for the process default).
/// Call once at start; later calls, or a provider already installed, change nothing.
///
/// ```
/// redcount::tls::install_crypto_provider();
/// assert!(rustls::crypto::CryptoProvider::get_default().is_some());
/// ```
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
