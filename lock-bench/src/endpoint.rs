//! Where a row's connections go, on each transport: what the rows and the
//! minimum lock connect with, apart from how the servers are started
//! (`transport.rs`).

/// Where a row's connections go.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// Plain TCP to one server, or to each of several (Redlock, W4).
    Plain(Vec<String>),
    /// TLS to one server.
    Tls {
        /// The `rediss://` URL.
        url: String,
        /// The CA the client trusts (PEM), and nothing else.
        ca_pem: String,
        /// The same server's plain port, for the bench's own `INFO`.
        admin_url: String,
    },
    /// A cluster, through the URLs of its nodes.
    Cluster(Vec<String>),
}

impl Endpoint {
    /// The plain URLs the bench reads `INFO` from: every server whose CPU
    /// the rows use.
    pub fn admin_urls(&self) -> Vec<String> {
        match self {
            Endpoint::Plain(urls) | Endpoint::Cluster(urls) => urls.clone(),
            Endpoint::Tls { admin_url, .. } => vec![admin_url.clone()],
        }
    }
}
