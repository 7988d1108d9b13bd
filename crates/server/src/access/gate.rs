//! Who may call: the caller a request names ([`Caller`]), let in by the
//! one [`Gate`] that every entry point calls (unary calls, the session
//! stream, the HTTP port): authenticated against the auth table in force
//! (`admit`, `let_in`) and checked per name (`Admitted::may`); refusals
//! are audited and counted, and a peer that keeps failing to authenticate
//! waits (see `penalty.rs`), whichever port it tries.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Status};

use crate::access::action::Action;
use crate::access::audit::{Audit, Record};
use crate::access::auth::{Auth, Credential, Permission, Principal, Refusal};
use crate::access::penalty::Penalties;
use crate::engine::SessionCheck;
use crate::metrics::Metrics;
use crate::net::conn::ConnInfo;

/// The gatekeeper: one per server, shared by the gRPC service and the
/// HTTP port, so a refusal is audited, counted and slowed the same way
/// wherever it happens.
#[derive(Clone)]
pub(crate) struct Gate {
    auth: Arc<Auth>,
    audit: Arc<Audit>,
    penalties: Arc<Penalties>,
    metrics: Arc<Metrics>,
}

/// Who is calling, as far as a request says: the credential it carries
/// and where it comes from. Kept by a session stream and checked again
/// against the auth table in force for each of its requests.
#[derive(Clone, Debug)]
pub struct Caller {
    credential: Credential,
    /// Why the connection's client certificate does not let it in, when
    /// the port requires one (see `tls.rs`).
    certificate_refused: Option<String>,
    /// Formatted only for an audit line.
    peer: Option<std::net::SocketAddr>,
}

impl Caller {
    fn peer(&self) -> String {
        self.peer.map(|p| p.to_string()).unwrap_or_default()
    }

    /// A caller on the HTTP port: a bearer token at most (browsers and
    /// scrapers send no client certificate there).
    pub(crate) fn http(
        authorization: Option<&[u8]>,
        peer: Option<std::net::SocketAddr>,
        auth_on: bool,
    ) -> Self {
        Self {
            credential: Credential::from_parts(authorization.filter(|_| auth_on), None),
            certificate_refused: None,
            peer,
        }
    }

    /// The caller of `request`; its credential is only read with `auth_on`.
    pub(crate) fn of<T>(request: &Request<T>, auth_on: bool) -> Self {
        let info = request.extensions().get::<ConnInfo>();
        use crate::net::tls::ClientCert;
        let cert = info.map_or(&ClientCert::NotAsked, |i| &i.client_cert);
        let cn = match cert {
            ClientCert::Verified(cn) => cn.as_deref(),
            _ => None,
        };
        let certificate_refused = match cert {
            ClientCert::NotAsked | ClientCert::Verified(_) => None,
            ClientCert::Missing => Some(
                "this server requires a client certificate signed by its client CA (--tls-cert and --tls-key)"
                    .to_string(),
            ),
            ClientCert::Refused(why) => Some(format!("the client certificate was refused: {why}")),
        };
        let authorization = request
            .metadata()
            .get("authorization")
            .filter(|_| auth_on)
            .map(|v| v.as_bytes());
        Self {
            credential: Credential::from_parts(authorization, cn),
            certificate_refused,
            peer: info.and_then(|i| i.peer),
        }
    }
}

/// A caller let in for one action: its principal (`None` with auth off).
pub struct Admitted<'a> {
    gate: &'a Gate,
    /// Borrowed from a session stream, which keeps its caller; owned for
    /// a unary call.
    caller: Cow<'a, Caller>,
    action: Action,
    principal: Option<Arc<Principal>>,
}

impl Admitted<'_> {
    fn name(&self) -> &str {
        self.principal
            .as_ref()
            .map_or("anonymous", |p| p.name.as_str())
    }

    /// `Ok` if the principal holds `permission` on `name` (a resource or,
    /// for list, a prefix); otherwise `PERMISSION_DENIED`, audited. The
    /// message names the rule, never what the resource holds.
    pub(crate) fn may(&self, permission: Permission, name: &str) -> Result<(), Status> {
        let Some(p) = &self.principal else {
            return Ok(());
        };
        if p.allows(permission, name) {
            return Ok(());
        }
        Err(self.refuse(
            name,
            Refusal::Denied(format!(
                "principal {:?} may not {}: no rule of the auth file gives it `{permission}` on a prefix of {name:?}",
                p.name, self.action
            )),
        ))
    }

    /// `Ok` if the principal holds `permission` on every name (a rule on
    /// the empty prefix).
    pub(crate) fn may_everything(&self, permission: Permission) -> Result<(), Status> {
        let Some(p) = &self.principal else {
            return Ok(());
        };
        if p.allows_everything(permission) {
            return Ok(());
        }
        Err(self.refuse(
            "",
            Refusal::Denied(format!(
                "principal {:?} may not {}: it needs `{permission}` on every name (a rule on the empty prefix \"\")",
                p.name, self.action
            )),
        ))
    }

    /// What the engine asks when this principal keeps a session alive
    /// (resumes it) or closes it: it must be the session's opener or hold
    /// `admin` on every name (a session opened without authentication, or
    /// stored before openers were, has no opener: anyone may act for it),
    /// and it must hold `lease` on every resource the session holds.
    /// Everything passes with auth off.
    pub(crate) fn session_check(&self) -> SessionCheck {
        let Some(p) = self.principal.clone() else {
            return SessionCheck::anyone();
        };
        let admin = p.allows_everything(Permission::Admin);
        let name = p.name.clone();
        SessionCheck {
            may_act_for: Box::new(move |opener| admin || opener.is_none_or(|o| o == name)),
            may_hold: Box::new(move |resource| p.allows(Permission::Lease, resource.as_str())),
        }
    }

    /// The principal's name, to record as a session's opener (`None` with
    /// auth off).
    pub(crate) fn opener(&self) -> Option<String> {
        self.principal.as_ref().map(|p| p.name.clone())
    }

    /// The principal let in (`None` with auth off). A reload of the auth
    /// file makes new principals, so a stream can tell that the table
    /// changed under it.
    pub(crate) fn principal(&self) -> Option<&Arc<Principal>> {
        self.principal.as_ref()
    }

    /// The refusal to give if the session this caller wants to keep alive
    /// holds a resource it may not hold: owned, so that it can wait for
    /// the engine's answer.
    pub(crate) fn session_refusal(&self) -> SessionRefusal {
        SessionRefusal {
            gate: self.gate.clone(),
            caller: self.caller.clone().into_owned(),
            principal: self.name().to_string(),
            action: self.action,
        }
    }

    fn refuse(&self, resource: &str, refusal: Refusal) -> Status {
        self.gate
            .refused(&self.caller, self.name(), self.action, resource, refusal)
    }

    /// Writes an audit line for an action that was let in: `outcome` is
    /// `ok`, or `indeterminate` if the server could not finish it.
    pub(crate) fn audit(&self, resource: &str, token: Option<u64>, outcome: &str) {
        self.gate.audit.record(&Record {
            principal: self.name(),
            action: self.action.as_str(),
            resource,
            token,
            outcome,
            peer: &self.caller.peer(),
        });
    }
}

/// `PERMISSION_DENIED` (audited) for keeping alive (resuming, or a
/// heartbeat after the auth file changed) or closing a session that
/// another principal opened, or that holds a resource the principal may
/// not hold. The message names neither the session's opener nor its
/// resources nor whether it holds any.
pub(crate) struct SessionRefusal {
    gate: Gate,
    caller: Caller,
    principal: String,
    action: Action,
}

impl SessionRefusal {
    pub(crate) fn status(self) -> Status {
        let why = format!(
            "principal {:?} may not {}: a session is kept alive or closed only by the principal that opened it (or one with `admin` on every name), and only with `lease` on every resource it holds",
            self.principal, self.action
        );
        self.gate.refused(
            &self.caller,
            &self.principal,
            self.action,
            "",
            Refusal::Denied(why),
        )
    }
}

impl Gate {
    pub(crate) fn new(
        auth: Arc<Auth>,
        audit: Arc<Audit>,
        penalties: Arc<Penalties>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            auth,
            audit,
            penalties,
            metrics,
        }
    }

    /// Auth off, audit lines to the log only.
    pub(crate) fn open(metrics: Arc<Metrics>) -> Self {
        Self::new(
            Arc::new(Auth::off()),
            Arc::new(Audit::log_only()),
            Arc::default(),
            metrics,
        )
    }

    /// Whether an auth file is in force (callers' credentials are read).
    pub(crate) fn is_on(&self) -> bool {
        self.auth.is_on()
    }

    /// Lets `caller` in for `action` if auth is off or its credential
    /// proves a principal of the table in force; `UNAUTHENTICATED`
    /// (audited) otherwise.
    pub(crate) fn admit<'a>(
        &'a self,
        caller: &'a Caller,
        action: Action,
    ) -> Result<Admitted<'a>, Status> {
        self.admit_as(Cow::Borrowed(caller), action)
    }

    fn admit_as<'a>(
        &'a self,
        caller: Cow<'a, Caller>,
        action: Action,
    ) -> Result<Admitted<'a>, Status> {
        if let Some(why) = &caller.certificate_refused {
            let refusal = Refusal::Unauthenticated(why.clone());
            return Err(self.refused(&caller, "unauthenticated", action, "", refusal));
        }
        let principal = match self.auth.table() {
            None => None,
            Some(table) => match table.authenticate(&caller.credential) {
                Ok(p) => Some(p),
                Err(refusal) => {
                    return Err(self.refused(&caller, "unauthenticated", action, "", refusal))
                }
            },
        };
        Ok(Admitted {
            gate: self,
            caller,
            action,
            principal,
        })
    }

    /// [`Gate::admit`], with a refused authentication answered
    /// only after its peer's penalty (see `penalty.rs`).
    pub(crate) async fn let_in<'a>(
        &'a self,
        caller: &'a Caller,
        action: Action,
    ) -> Result<Admitted<'a>, Status> {
        self.let_in_as(Cow::Borrowed(caller), action).await
    }

    /// [`Gate::let_in`] for the caller of a unary `request`: the first
    /// line of every unary handler.
    pub(crate) async fn let_in_request<T>(
        &self,
        request: &Request<T>,
        action: Action,
    ) -> Result<Admitted<'_>, Status> {
        let caller = Caller::of(request, self.is_on());
        self.let_in_as(Cow::Owned(caller), action).await
    }

    async fn let_in_as<'a>(
        &'a self,
        caller: Cow<'a, Caller>,
        action: Action,
    ) -> Result<Admitted<'a>, Status> {
        let peer = caller.peer;
        let refusal = match self.admit_as(caller, action) {
            Ok(admitted) => return Ok(admitted),
            Err(status) => status,
        };
        if refusal.code() == tonic::Code::Unauthenticated {
            if let Some(peer) = peer {
                let penalty = self.penalties.failed(peer.ip(), Instant::now());
                if penalty.starts {
                    tracing::warn!(peer = %peer.ip(), failures = crate::access::penalty::FREE_FAILURES + 1, "repeated authentication failures from this address: its refusals now wait, up to 1 s each");
                }
                if !penalty.wait.is_zero() {
                    tokio::time::sleep(penalty.wait).await;
                }
            }
        }
        Err(refusal)
    }

    /// The status for a refused call, after its audit line.
    fn refused(
        &self,
        caller: &Caller,
        principal: &str,
        action: Action,
        resource: &str,
        refusal: Refusal,
    ) -> Status {
        let (outcome, status) = match refusal {
            Refusal::Unauthenticated(m) => ("unauthenticated", Status::unauthenticated(m)),
            Refusal::Denied(m) => ("permission_denied", Status::permission_denied(m)),
        };
        self.metrics.auth_refused.inc();
        self.audit.record(&Record {
            principal,
            action: action.as_str(),
            resource,
            token: None,
            outcome,
            peer: &caller.peer(),
        });
        status
    }
}
