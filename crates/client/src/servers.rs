//! The servers a client knows, the one it talks to now, and the leader
//! hint in a follower's answer.

use std::time::Duration;

use baton_proto::v1::leases_client::LeasesClient;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use crate::ClientError;

/// The leader's address from a follower's answer: `Some("")` while no
/// leader is known, `None` if the answer is not a follower's.
pub(crate) fn redirect(status: &tonic::Status) -> Option<String> {
    if status.code() != Code::Unavailable {
        return None;
    }
    status
        .metadata()
        .get(baton_proto::LEADER_METADATA)
        .map(|v| v.to_str().unwrap_or_default().to_string())
}

/// `127.0.0.1:7700` means plain HTTP/2 (HTTPS with `tls`), as `PGHOST` or
/// etcdctl take an address.
pub(crate) fn normalize(url: &str, tls: bool) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else if tls {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    }
}

pub(crate) fn endpoint(url: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, ClientError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| ClientError::Invalid(format!("server url {url:?}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    match tls {
        Some(config) => endpoint.tls_config(config.clone()).map_err(|e| {
            ClientError::Invalid(format!(
                "TLS settings for {url:?}: {}",
                crate::error_chain(&e)
            ))
        }),
        None => Ok(endpoint),
    }
}

/// The servers a client knows and the one it talks to now. Shared by clones,
/// so a leader found by one is used by all.
#[derive(Debug)]
pub(crate) struct Servers {
    pub(crate) urls: Vec<String>,
    pub(crate) tls: Option<ClientTlsConfig>,
    pub(crate) state: std::sync::Mutex<ServersState>,
}

#[derive(Debug)]
pub(crate) struct ServersState {
    pub(crate) current: String,
    pub(crate) channels: std::collections::HashMap<String, LeasesClient<Channel>>,
}

impl Servers {
    pub(crate) fn current(&self) -> Result<(String, LeasesClient<Channel>), ClientError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let url = st.current.clone();
        if let Some(c) = st.channels.get(&url) {
            return Ok((url, c.clone()));
        }
        let c = LeasesClient::new(endpoint(&url, self.tls.as_ref())?.connect_lazy());
        st.channels.insert(url.clone(), c.clone());
        Ok((url, c))
    }

    pub(crate) fn switch_to(&self, url: &str) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).current = url.to_string();
    }

    /// Moves on from `from` to the next configured server.
    pub(crate) fn rotate(&self, from: &str) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.current != from {
            return;
        }
        let i = self.urls.iter().position(|u| u == from);
        let next = i.map_or(0, |i| (i + 1) % self.urls.len());
        st.current = self.urls[next].clone();
    }
}
