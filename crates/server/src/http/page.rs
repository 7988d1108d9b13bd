//! The operator page (`GET /`, one static file with its script inline)
//! and the data it polls, as JSON:
//!
//! - `GET /api/overview`: this server's role, term, leader and members,
//!   the lease, waiter and session counts and the headline series;
//! - `GET /api/leases?prefix=P&after=NAME&limit=N`: one page of
//!   resources in name order, paged by the engine (never a full dump);
//! - `GET /api/history?resource=NAME`: the resource's recent holder
//!   changes, newest first (see `history.rs`);
//! - `POST /api/fence?resource=NAME` with `x-baton-confirm: fence`: an
//!   operator fence through the same path, permission and audit line as
//!   `baton fence` (the header cannot be sent by a cross-site form; a page
//!   elsewhere whose name resolves here, DNS rebinding, is refused by its
//!   `Host` and `Origin`, see `guard.rs`).
//!
//! Query parameters are decoded strictly (`query.rs`) and follow gRPC's
//! rules for the same fields; every refusal of the caller is one answer.
//!
//! Every data call goes through the server's one gate. With an auth file
//! the caller's bearer token (typed once into the page and kept for the
//! tab) must name a principal with `read`; a list shows only names under
//! the prefixes it may read, and the server-wide figures need `read` on
//! every name, as `/metrics` does.

use std::time::Instant;

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use baton_core::{LeaseStatus, RESOURCE_NAME_LEN_BYTES_MAX};
use baton_proto::LIST_LIMIT_MAX;
use serde::Serialize;
use serde_json::json;
use tonic::{Code, Status};

use super::{HttpState, Peer};
use crate::access::auth::Permission;
use crate::access::Action;
use crate::access::{Admitted, Caller};
use crate::history::{HISTORY_PER_RESOURCE_MAX, HISTORY_TOTAL_MAX};
use crate::service::parse_resource;

pub(super) const PAGE_HTML: &str = include_str!("page.html");

/// Rows per page when the caller names no limit.
const PAGE_ROWS_DEFAULT: usize = 50;

/// What the page says about the history it shows.
fn history_note() -> String {
    format!(
        "kept in this server's memory only: the last {HISTORY_PER_RESOURCE_MAX} changes per resource and {HISTORY_TOTAL_MAX} in all; lost on restart, and a new leader starts with none"
    )
}

pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE_HTML,
    )
        .into_response()
}

/// The one answer to a refused caller, whatever the reason: an unknown
/// token and a known one without the permission look the same from the
/// port (as on `/metrics`), so it cannot tell which tokens are valid; the
/// audit line says which it was.
const REFUSED: &str = "unauthenticated or not permitted: the page and its API need `authorization: Bearer TOKEN` of a principal with the permission for what is asked (read on the names shown, fence to fence)";

/// A refusal or failure as the page's data calls answer it: the gRPC
/// code's HTTP status and the message, as `{"error": ...}`; every
/// refusal of the caller is one 401 with one message.
fn error(status: Status) -> Response {
    if matches!(
        status.code(),
        Code::Unauthenticated | Code::PermissionDenied
    ) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({ "error": REFUSED })),
        )
            .into_response();
    }
    let code = match status.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (code, Json(json!({ "error": status.message() }))).into_response()
}

/// The caller of a data call: its bearer token at most.
fn caller(s: &HttpState, peer: Peer, headers: &HeaderMap) -> Caller {
    let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    Caller::http(authorization, Some(peer.0), s.gate.is_on())
}

/// What a caller let in may read: `None` for everything (auth off, or a
/// rule on the empty prefix), else the prefixes its rules give `read` on.
fn readable(who: &Admitted<'_>) -> Option<Vec<String>> {
    let p = who.principal()?;
    let prefixes = p.prefixes(Permission::Read);
    (prefixes.first().map(String::as_str) != Some("")).then_some(prefixes)
}

/// The name ranges a list of `requested` covers for a caller who may read
/// `readable`, in name order: all of `requested` if a readable prefix
/// starts it, else each readable prefix that lies under it (disjoint, as
/// none of them starts another).
pub(crate) fn ranges(requested: &str, readable: Option<&[String]>) -> Vec<String> {
    let Some(readable) = readable else {
        return vec![requested.to_string()];
    };
    if readable.iter().any(|p| requested.starts_with(p.as_str())) {
        return vec![requested.to_string()];
    }
    readable
        .iter()
        .filter(|p| p.starts_with(requested))
        .cloned()
        .collect()
}

/// The audited refusal of a caller who may read nothing under `prefix`.
fn denied(who: &Admitted<'_>, prefix: &str) -> Status {
    who.may(Permission::Read, prefix).err().unwrap_or_else(|| {
        Status::permission_denied(format!("nothing under {prefix:?} may be read"))
    })
}

#[derive(Serialize)]
struct Member {
    node: String,
    advertise: String,
    seen_ms_ago: u64,
    leader: bool,
}

pub(super) async fn overview(
    State(s): State<HttpState>,
    axum::Extension(peer): axum::Extension<Peer>,
    headers: HeaderMap,
) -> Result<Response, Response> {
    let caller = caller(&s, peer, &headers);
    let who = s
        .gate
        .let_in(&caller, Action::PageRead)
        .await
        .map_err(error)?;
    let readable = readable(&who);
    if readable.as_ref().is_some_and(Vec::is_empty) {
        return Err(error(denied(&who, "")));
    }
    let view = s.seat.view();
    let cluster = view.as_ref().map(|v| {
        let members: Vec<Member> = v
            .members
            .iter()
            .map(|(node, advertise, seen_ms_ago)| Member {
                leader: v.leader_node.as_deref() == Some(node.as_str()),
                node: node.clone(),
                advertise: advertise.clone(),
                seen_ms_ago: *seen_ms_ago,
            })
            .collect();
        json!({
            "name": v.cluster,
            "term": v.term,
            "leader": v.leader,
            "members": members,
        })
    });
    let m = &s.metrics;
    let figures = readable.is_none().then(|| {
        json!({
            "leases": m.leases.get(),
            "waiters": m.waiters.get(),
            "sessions": m.sessions.get(),
            "grants": m.grants.get(),
            "hand_offs": m.ownership_transfers.get(),
            "expiries": m.expiries.get(),
            "fences": m.fences.get(),
            "series": s.observed.figures(),
        })
    });
    Ok(Json(json!({
        "node": s.seat.node,
        "role": if s.seat.is_leader() { "leader" } else { "follower" },
        "ready": s.observed.ready.load(std::sync::atomic::Ordering::Acquire),
        "cluster": cluster,
        "principal": who.principal().map(|p| p.name.clone()),
        "readable": readable,
        "figures": figures,
        "history_note": history_note(),
    }))
    .into_response())
}

/// `/api/leases`'s parameters, by gRPC `List`'s rules.
struct LeasesQuery {
    prefix: String,
    after: Option<String>,
    limit: usize,
}

impl LeasesQuery {
    fn parse(raw: Option<&str>) -> Result<Self, Status> {
        let mut p = super::query::params(raw, &["prefix", "after", "limit"])?;
        let prefix = p.remove("prefix").unwrap_or_default();
        if prefix.len() > RESOURCE_NAME_LEN_BYTES_MAX {
            return Err(Status::invalid_argument(format!(
                "prefix is {} bytes; the limit is {RESOURCE_NAME_LEN_BYTES_MAX} bytes",
                prefix.len()
            )));
        }
        let limit = match p.remove("limit") {
            None => PAGE_ROWS_DEFAULT,
            Some(text) => text.parse::<usize>().map_err(|_| {
                Status::invalid_argument(format!("limit {text:?} is not a whole number"))
            })?,
        };
        if limit == 0 || limit > LIST_LIMIT_MAX as usize {
            return Err(Status::invalid_argument(format!(
                "limit {limit} is outside 1 to {LIST_LIMIT_MAX}"
            )));
        }
        Ok(Self {
            prefix,
            after: p.remove("after").filter(|a| !a.is_empty()),
            limit,
        })
    }
}

/// `resource=NAME`, by the name rule.
fn resource_param(raw: Option<&str>) -> Result<baton_core::ResourceName, Status> {
    let mut p = super::query::params(raw, &["resource"])?;
    parse_resource("resource", &p.remove("resource").unwrap_or_default())
}

#[derive(Serialize)]
struct Row {
    resource: String,
    /// Tokens can pass 2^53: strings, so a browser keeps every digit.
    token: Option<String>,
    holder: Option<String>,
    remaining_ms: u64,
    ttl_ms: u64,
    waiters: usize,
    /// A semaphore's number of permits (absent for a lock).
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<u32>,
    /// Its shared holders or permits, by slot (none for an exclusive lock).
    holders: Vec<SlotRow>,
}

/// One shared holder or permit on the page.
#[derive(Serialize)]
struct SlotRow {
    slot: u32,
    token: String,
    holder: Option<String>,
    remaining_ms: u64,
}

impl From<LeaseStatus> for Row {
    fn from(s: LeaseStatus) -> Self {
        Self {
            resource: s.resource.to_string(),
            token: s.holder_token.map(|t| t.get().to_string()),
            holder: s.holder.map(|h| h.to_string()),
            remaining_ms: s.remaining_ms,
            ttl_ms: s.ttl_ms,
            waiters: s.n_waiters,
            permits: match s.kind {
                Some(baton_core::Kind::Semaphore(n)) => Some(n),
                _ => None,
            },
            holders: s
                .slots
                .into_iter()
                .map(|x| SlotRow {
                    slot: x.slot,
                    token: x.token.get().to_string(),
                    holder: x.holder.map(|h| h.to_string()),
                    remaining_ms: x.remaining_ms,
                })
                .collect(),
        }
    }
}

pub(super) async fn leases(
    State(s): State<HttpState>,
    axum::Extension(peer): axum::Extension<Peer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, Response> {
    let caller = caller(&s, peer, &headers);
    let who = s
        .gate
        .let_in(&caller, Action::PageList)
        .await
        .map_err(error)?;
    let q = LeasesQuery::parse(raw.as_deref()).map_err(error)?;
    let limit = q.limit;
    let readable = readable(&who);
    let ranges = ranges(&q.prefix, readable.as_deref());
    if ranges.is_empty() {
        return Err(error(denied(&who, &q.prefix)));
    }
    let mut rows: Vec<Row> = Vec::new();
    for range in ranges {
        let want = limit - rows.len();
        let entries = s
            .service
            .list_entries(range, q.after.clone(), want)
            .await
            .map_err(error)?;
        rows.extend(entries.into_iter().map(Row::from));
        if rows.len() == limit {
            break;
        }
    }
    let next = (rows.len() == limit).then(|| rows[rows.len() - 1].resource.clone());
    Ok(Json(json!({ "rows": rows, "next": next, "readable": readable })).into_response())
}

pub(super) async fn history(
    State(s): State<HttpState>,
    axum::Extension(peer): axum::Extension<Peer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, Response> {
    let caller = caller(&s, peer, &headers);
    let who = s
        .gate
        .let_in(&caller, Action::PageHistory)
        .await
        .map_err(error)?;
    let resource = resource_param(raw.as_deref()).map_err(error)?;
    who.may(Permission::Read, resource.as_str())
        .map_err(error)?;
    let now = Instant::now();
    let entries: Vec<_> = s
        .observed
        .history
        .of(resource.as_str())
        .into_iter()
        .map(|e| {
            json!({
                "seq": e.seq,
                "kind": e.change.kind.as_str(),
                "token": e.change.token.get().to_string(),
                "revoked": e.change.revoked.map(|t| t.get().to_string()),
                "holder": e.change.holder.map(|h| h.to_string()),
                "ago_ms": now.saturating_duration_since(e.at).as_millis() as u64,
            })
        })
        .collect();
    Ok(Json(json!({
        "resource": resource.as_str(),
        "entries": entries,
        "note": history_note(),
    }))
    .into_response())
}

/// The header a fence from the page must carry, and its value.
pub const CONFIRM_HEADER: &str = "x-baton-confirm";

pub(super) async fn fence(
    State(s): State<HttpState>,
    axum::Extension(peer): axum::Extension<Peer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, Response> {
    let caller = caller(&s, peer, &headers);
    let who = s.gate.let_in(&caller, Action::Fence).await.map_err(error)?;
    if headers.get(CONFIRM_HEADER).map(|v| v.as_bytes()) != Some(b"fence") {
        return Err(error(Status::invalid_argument(format!(
            "a fence from the page needs the header `{CONFIRM_HEADER}: fence` (the page sends it once the operator confirms)"
        ))));
    }
    let resource = resource_param(raw.as_deref()).map_err(error)?;
    let out = s.service.fence_as(&who, resource).await.map_err(error)?;
    Ok(Json(json!({
        "token": out.token.get().to_string(),
        "revoked": out.revoked.map(|t| t.get().to_string()),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn a_list_covers_only_what_its_caller_may_read() {
        let r = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(ranges("a:", None), ["a:"], "auth off: everything");
        let readable = r(&["billing:", "jobs:eu:"]);
        assert_eq!(ranges("billing:7", Some(&readable)), ["billing:7"]);
        assert_eq!(
            ranges("", Some(&readable)),
            ["billing:", "jobs:eu:"],
            "the readable prefixes under the request, in name order"
        );
        assert_eq!(ranges("jobs:", Some(&readable)), ["jobs:eu:"]);
        assert!(ranges("other:", Some(&readable)).is_empty());
    }
}
