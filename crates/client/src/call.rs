//! How a call reaches the leader: which member it goes to, what moves it
//! on to another, and which calls may be sent again after their request
//! may have reached a server.

use std::time::Duration;

use baton_proto::v1::{self, leases_client::LeasesClient};
use tonic::transport::Channel;
use tonic::Request;

use crate::error::{failed_at, from_status, never_connected, server_trouble};
use crate::servers::{redirect, Unreachable};
use crate::{Client, ClientError};

/// Whether a call may be sent again after its request may have reached a
/// server: a read may, an effect never (its outcome is then unknown), and
/// an acquire carrying a request id may once marked as a repeat (the
/// function marks it, given the time since its first attempt was sent).
pub(crate) enum Kind<M> {
    Read,
    Effect,
    Repeatable(fn(&mut M, Duration)),
}

// By hand: derived, they would ask `M` to be `Copy` too.
impl<M> Clone for Kind<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Kind<M> {}

/// Marks an acquire as a repeat of the one first sent `since` ago: the
/// same request id, the time since its first attempt, and what is left of
/// its wait.
pub(crate) fn repeat_acquire(message: &mut v1::AcquireRequest, since: Duration) {
    let since_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
    message.first_sent_ms_ago = Some(since_ms.max(1));
    message.wait_ms = message.wait_ms.saturating_sub(since_ms);
}

/// A fresh request id: 16 bytes of the thread's cryptographic generator
/// (ChaCha12 seeded from the operating system, `rand::rng`), as the
/// server draws acquisition ids: a request id is as secret as they are.
pub(crate) fn request_id() -> Vec<u8> {
    use rand::Rng;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes.to_vec()
}

impl Client {
    pub(crate) fn request<T>(&self, message: T, extra: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.rpc_timeout + extra);
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        // The caller's span, when traces are exported: the server's span
        // for this call joins its trace.
        if let Some(parent) = baton_telemetry::traceparent()
            .and_then(|t| tonic::metadata::MetadataValue::try_from(t).ok())
        {
            request
                .metadata_mut()
                .insert(baton_telemetry::TRACEPARENT, parent);
        }
        request
    }

    /// Sends `message` to the leader. Followers' answers and failed dials
    /// are definite, so the call moves on (to the named leader, or to the
    /// first other member that answers, pausing briefly while no member
    /// knows a leader) until `rpc_timeout`; once every member failed to
    /// dial, it ends at once. A `Read` whose connection broke or timed out
    /// is sent again to another member; any other failure is returned as
    /// it is.
    pub(crate) async fn call<M, R, F, Fut>(
        &self,
        message: M,
        extra: Duration,
        kind: Kind<M>,
        f: F,
    ) -> Result<R, ClientError>
    where
        M: Clone,
        F: Fn(LeasesClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let mut lost = None;
        match self.attempts(message, extra, kind, f, &mut lost).await {
            // An answer was lost, and no repeat got one: what the first
            // attempt did is unknown, however the repeats failed.
            Err(e) if e.is_definite() => match lost {
                Some(first) => Err(ClientError::Indeterminate(format!(
                    "{first}; sent again until the call's time was up, no repeat was answered: {e}"
                ))),
                None => Err(e),
            },
            out => out,
        }
    }

    /// [`Client::call`]'s attempts; `lost` keeps the first lost answer of
    /// a repeatable call.
    async fn attempts<M, R, F, Fut>(
        &self,
        mut message: M,
        extra: Duration,
        kind: Kind<M>,
        f: F,
        lost: &mut Option<ClientError>,
    ) -> Result<R, ClientError>
    where
        M: Clone,
        F: Fn(LeasesClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        let mut misses = 0usize;
        let mut unreachable = Unreachable::new();
        loop {
            let (url, channel) = self.servers.current(&mut unreachable).await?;
            let status = match f(channel, self.request(message.clone(), extra)).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => status,
            };
            let hint = redirect(&status);
            let last = if let Some(leader) = hint.as_ref().filter(|l| !l.is_empty() && **l != url) {
                self.servers.switch_to(leader);
                ClientError::Connect {
                    url,
                    message: format!("not the leader; the leader is {leader}"),
                }
            } else if hint.is_some() {
                misses += 1;
                self.no_leader_at(&url, &status)?
            } else if never_connected(&status) {
                // Definite: nothing was sent. The next turn dials the others.
                let why = from_status(status).to_string();
                self.servers.pass_over(&url);
                unreachable.push((url, why));
                continue;
            } else if !matches!(kind, Kind::Effect) && server_trouble(&status) {
                // A read, or an acquire whose answer was lost: sent again
                // (the acquire marked as a repeat) until its time is up.
                self.servers.pass_over(&url);
                let budget = self.rpc_timeout + extra;
                let e = failed_at(status, &url, budget);
                match kind {
                    Kind::Repeatable(mark) if started.elapsed() < budget => {
                        lost.get_or_insert(e);
                        mark(&mut message, started.elapsed());
                        continue;
                    }
                    _ => e,
                }
            } else {
                return Err(self.possibly_applied(status, &url, self.rpc_timeout + extra));
            };
            if started.elapsed() >= self.rpc_timeout {
                return Err(last);
            }
            if misses >= self.servers.urls.len().max(2) {
                misses = 0;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }

    /// A follower that knows no leader answered: definite. The error to
    /// report if the call ends here; `Err` (at once) with a single server.
    fn no_leader_at(&self, url: &str, status: &tonic::Status) -> Result<ClientError, ClientError> {
        let e = ClientError::Connect {
            url: url.to_string(),
            message: status.message().to_string(),
        };
        if self.servers.urls.len() == 1 {
            return Err(e);
        }
        self.servers.rotate(url);
        Ok(e)
    }

    /// A call that may have been applied failed: never repeated. The next
    /// call dials the others first if this one may be gone.
    fn possibly_applied(&self, status: tonic::Status, url: &str, budget: Duration) -> ClientError {
        if self.servers.urls.len() > 1 && server_trouble(&status) {
            self.servers.pass_over(url);
        }
        failed_at(status, url, budget)
    }
}
