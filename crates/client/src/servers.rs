//! The servers a client knows, the one it talks to now, the ones it passes
//! over for a while, and the leader hint in a follower's answer.

use std::collections::HashMap;
use std::time::Duration;

use baton_proto::v1::leases_client::LeasesClient;
use tokio::time::Instant;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use crate::dial::Dialer;
use crate::ClientError;

/// The port of an address that names none (`baton serve --listen`'s).
pub(crate) const PORT_DEFAULT: u16 = 7700;
/// How long a member that failed a dial is passed over (tried only when
/// every other member was passed over too).
const PASS_OVER_FOR: Duration = Duration::from_secs(5);

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

const ADDRESS_RULE: &str = "write HOST, HOST:PORT, [IPv6]:PORT, a bare PORT (on 127.0.0.1), or a URL with http:// or https://";

/// A server address as users write it, as the URL the client dials:
/// `HOST` and `http://HOST` mean port 7700, a bare `PORT` means
/// `127.0.0.1:PORT`, `[::1]` and `[::1]:PORT` are IPv6; without a scheme,
/// `https://` with `tls`, `http://` otherwise. A port out of 1-65535, an
/// unknown scheme or a path is refused naming the rule.
pub(crate) fn normalize(raw: &str, tls: bool) -> Result<String, ClientError> {
    let text = raw.trim();
    let bad = |why: String| ClientError::Invalid(format!("server address {text:?}: {why}"));
    let (scheme, rest) = match text.split_once("://") {
        Some((s, rest)) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {
            (s.to_ascii_lowercase(), rest)
        }
        Some((s, _)) => {
            return Err(bad(format!(
                "the scheme {s:?} is not http or https; {ADDRESS_RULE}"
            )))
        }
        None if tls => ("https".to_string(), text),
        None => ("http".to_string(), text),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) || authority.is_empty() {
        return Err(bad(format!("not an address; {ADDRESS_RULE}")));
    }
    if !text.contains("://") && authority.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(format!("{scheme}://127.0.0.1:{}", port(authority, &bad)?));
    }
    let (host, port_text) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, after) = v6.split_once(']').ok_or_else(|| {
            bad(format!(
                "an IPv6 address needs its closing ']'; {ADDRESS_RULE}"
            ))
        })?;
        inside
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| bad(format!("[{inside}] is not an IPv6 address")))?;
        let port_text = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| {
                bad(format!(
                    "expected ':PORT' after the IPv6 address; {ADDRESS_RULE}"
                ))
            })?),
        };
        (format!("[{inside}]"), port_text)
    } else {
        match authority.split_once(':') {
            Some((_, p)) if p.contains(':') => {
                return Err(bad(format!(
                    "write an IPv6 address in brackets, like [::1]:7700; {ADDRESS_RULE}"
                )))
            }
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(bad(format!("no host; {ADDRESS_RULE}")));
    }
    let port = match port_text {
        Some(p) => port(p, &bad)?,
        None => PORT_DEFAULT,
    };
    Ok(format!("{scheme}://{host}:{port}"))
}

fn port(text: &str, bad: &dyn Fn(String) -> ClientError) -> Result<u16, ClientError> {
    match text.parse::<u64>() {
        Ok(p) if (1..=65_535).contains(&p) => Ok(p as u16),
        Ok(p) => Err(bad(format!(
            "port {p} is out of range; a port is 1 to 65535"
        ))),
        Err(_) => Err(bad(format!(
            "port {text:?} is not a number; a port is 1 to 65535"
        ))),
    }
}

pub(crate) fn endpoint(
    url: &str,
    tls: Option<&ClientTlsConfig>,
    dial_timeout: Duration,
) -> Result<Endpoint, ClientError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| ClientError::Invalid(format!("server url {url:?}: {e}")))?
        // An open connection to a server that stopped answering is closed
        // after two dial timeouts without an answer to a PING: what was in
        // flight on it fails, and the next call dials again.
        .http2_keep_alive_interval(dial_timeout)
        .keep_alive_timeout(dial_timeout)
        .keep_alive_while_idle(true);
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
    pub(crate) dial_timeout: Duration,
    pub(crate) state: std::sync::Mutex<ServersState>,
}

#[derive(Debug, Default)]
pub(crate) struct ServersState {
    /// The member calls go to; empty when none is chosen (then the next
    /// call dials every member at once).
    pub(crate) current: String,
    pub(crate) channels: HashMap<String, LeasesClient<Channel>>,
    /// Members that failed a dial, passed over until then.
    passed_over: HashMap<String, Instant>,
}

/// The members a call found unreachable, with why: the call ends, at once
/// and definitely, when it holds every member.
pub(crate) type Unreachable = Vec<(String, String)>;

impl Servers {
    pub(crate) fn new(
        urls: Vec<String>,
        tls: Option<ClientTlsConfig>,
        dial_timeout: Duration,
    ) -> Self {
        Self {
            urls,
            tls,
            dial_timeout,
            state: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ServersState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn channel(&self, url: &str) -> Result<LeasesClient<Channel>, ClientError> {
        let endpoint = endpoint(url, self.tls.as_ref(), self.dial_timeout)?;
        let dialer = Dialer {
            dial_timeout: self.dial_timeout,
        };
        Ok(LeasesClient::new(
            endpoint.connect_with_connector_lazy(dialer),
        ))
    }

    /// The member to send the next call to: the current one, or the first
    /// to answer of all members dialed at once (see [`Servers::find`]).
    pub(crate) async fn current(
        &self,
        unreachable: &mut Unreachable,
    ) -> Result<(String, LeasesClient<Channel>), ClientError> {
        {
            let mut st = self.lock();
            let url = st.current.clone();
            if !url.is_empty() {
                if let Some(c) = st.channels.get(&url) {
                    return Ok((url, c.clone()));
                }
                let c = self.channel(&url)?;
                st.channels.insert(url.clone(), c.clone());
                return Ok((url, c));
            }
        }
        self.find(unreachable).await
    }

    /// Dials every member not yet found unreachable by this call at once
    /// (those passed over recently only when no other is left) and makes
    /// the first that answers current. Each failure is recorded in
    /// `unreachable` and passes the member over; once every member is
    /// there, the call ends with all their reasons.
    pub(crate) async fn find(
        &self,
        unreachable: &mut Unreachable,
    ) -> Result<(String, LeasesClient<Channel>), ClientError> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        loop {
            let candidates = self.candidates(unreachable);
            if candidates.is_empty() {
                return Err(self.none_reachable(unreachable));
            }
            let mut dials: FuturesUnordered<_> = candidates
                .into_iter()
                .map(|url| async move {
                    let dialer = Dialer {
                        dial_timeout: self.dial_timeout,
                    };
                    let endpoint = endpoint(&url, self.tls.as_ref(), self.dial_timeout);
                    let result = match endpoint {
                        Ok(e) => e
                            .connect_with_connector(dialer)
                            .await
                            .map_err(|e| crate::error::connect_cause(&e)),
                        Err(e) => Err(e.to_string()),
                    };
                    (url, result)
                })
                .collect();
            while let Some((url, result)) = dials.next().await {
                match result {
                    Ok(channel) => {
                        let c = LeasesClient::new(channel);
                        let mut st = self.lock();
                        st.passed_over.remove(&url);
                        st.channels.insert(url.clone(), c.clone());
                        st.current = url.clone();
                        return Ok((url, c));
                    }
                    Err(why) => {
                        self.pass_over(&url);
                        unreachable.push((url, why));
                    }
                }
            }
        }
    }

    /// Members this call has not found unreachable: those not passed over
    /// first; the passed-over ones only when nothing else is left.
    fn candidates(&self, unreachable: &Unreachable) -> Vec<String> {
        let now = Instant::now();
        let st = self.lock();
        let untried: Vec<&String> = self
            .urls
            .iter()
            .filter(|u| !unreachable.iter().any(|(v, _)| v == *u))
            .collect();
        let fresh: Vec<String> = untried
            .iter()
            .filter(|u| st.passed_over.get(**u).is_none_or(|until| *until <= now))
            .map(|u| (*u).clone())
            .collect();
        if fresh.is_empty() {
            untried.into_iter().cloned().collect()
        } else {
            fresh
        }
    }

    fn none_reachable(&self, unreachable: &Unreachable) -> ClientError {
        let message = if unreachable.len() == 1 {
            unreachable[0].1.clone()
        } else {
            unreachable
                .iter()
                .map(|(url, why)| format!("{url}: {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        ClientError::Connect {
            url: self.urls.join(","),
            message: format!("{message}; nothing was sent"),
        }
    }

    /// Passes `url` over for a while; if it was current, the next call
    /// dials every member again.
    pub(crate) fn pass_over(&self, url: &str) {
        let mut st = self.lock();
        st.passed_over
            .insert(url.to_string(), Instant::now() + PASS_OVER_FOR);
        if st.current == url {
            st.current.clear();
        }
    }

    pub(crate) fn switch_to(&self, url: &str) {
        self.lock().current = url.to_string();
    }

    /// Moves on from `from`: with several members, the next call dials
    /// every member but `from` first (a follower that knows no leader, a
    /// server that stopped answering an open stream).
    pub(crate) fn rotate(&self, from: &str) {
        if self.urls.len() > 1 {
            self.pass_over(from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn addresses_as_users_write_them() {
        for (raw, tls, url) in [
            ("127.0.0.1:7700", false, "http://127.0.0.1:7700"),
            ("localhost", false, "http://localhost:7700"),
            ("http://localhost", false, "http://localhost:7700"),
            ("http://db1:9000/", false, "http://db1:9000"),
            ("HTTP://db1:9000", false, "http://db1:9000"),
            ("7700", false, "http://127.0.0.1:7700"),
            (" 7800 ", false, "http://127.0.0.1:7800"),
            ("[::1]", false, "http://[::1]:7700"),
            ("[::1]:7701", false, "http://[::1]:7701"),
            ("baton.internal:7700", true, "https://baton.internal:7700"),
            (
                "https://baton.internal",
                true,
                "https://baton.internal:7700",
            ),
            ("9000", true, "https://127.0.0.1:9000"),
        ] {
            assert_eq!(normalize(raw, tls).unwrap(), url, "{raw}");
        }
    }

    #[test]
    fn bad_addresses_are_refused_naming_the_rule() {
        for (raw, says) in [
            (
                "127.0.0.1:99999",
                "port 99999 is out of range; a port is 1 to 65535",
            ),
            ("99999", "port 99999 is out of range"),
            ("0", "port 0 is out of range"),
            ("host:0", "port 0 is out of range"),
            ("host:http", "port \"http\" is not a number"),
            ("::1", "in brackets, like [::1]:7700"),
            ("[::1", "closing ']'"),
            ("[nothere]:1", "is not an IPv6 address"),
            ("[::1]x", "expected ':PORT'"),
            ("ftp://host:1", "the scheme \"ftp\" is not http or https"),
            ("http://host:1/path", "not an address"),
            ("user@host:1", "not an address"),
            (":7700", "no host"),
        ] {
            let err = normalize(raw, false).unwrap_err().to_string();
            assert!(err.contains(says), "{raw}: {err}");
            assert!(err.contains(raw), "names the address: {err}");
        }
    }
}
