//! How the fence kit calls its SQL functions and reads their answers:
//! the statements, their parameters, and a row (or a refusal raised as an
//! error) as an [`Outcome`](crate::Outcome).

use super::*;

pub(super) const FENCE_SQL: &str =
    "SELECT outcome, token, current_token, current_seq, detail, result
    FROM baton.fence_impl($1, $2, $3, $4, $5, $6, $7, $8)";
pub(super) const FENCE_SHARED_SQL: &str =
    "SELECT outcome, token, current_token, current_seq, detail, result
    FROM baton.fence_shared_impl($1, $2, $3, $4, $5, $6, $7)";
pub(super) const FENCE_OR_ABORT_SQL: &str =
    "SELECT outcome, token, current_token, current_seq, detail, result
    FROM baton.fence_or_abort_impl($1, $2, $3, $4, $5, $6, $7, $8)";
/// SQLSTATE of a pipelined fence that did not apply (migration 4).
pub(super) const NOT_APPLIED: &str = "BF001";
pub(super) const PUBLISH_SQL: &str =
    "SELECT outcome, token, current_token, current_seq, detail, result
    FROM baton.publish($1, $2, $3, $4, $5)";

/// A PostgreSQL error as a person needs it: the server's severity, message
/// and SQLSTATE, with its detail and hint; for a failure the server did not
/// answer (a refused connection, a broken socket), the error and its
/// causes. `tokio_postgres::Error`'s own text is only "db error".
pub fn describe_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut m = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            m = format!("{m}; detail: {detail}");
        }
        if let Some(hint) = db.hint() {
            m = format!("{m}; hint: {hint}");
        }
        return m;
    }
    baton_telemetry::error_chain(e)
}

/// A connection string fit for a message: a password, in a URL
/// (`postgres://user:secret@host`) or as `password=secret`, becomes `***`.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host)) = rest.split_once('@') {
            if let Some((user, _)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
        return url.to_string();
    }
    url.split_whitespace()
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn seq(v: i64) -> Result<Sequence, FenceError> {
    Sequence::new(v as u64).map_err(|e| FenceError::Corrupt(e.to_string()))
}

/// The columns of a fence result, from a row or from a pipelined fence's error.
pub(super) struct Fields {
    outcome: String,
    token: i64,
    current_token: Option<i64>,
    current_seq: Option<i64>,
    detail: Option<String>,
    result: Option<Vec<u8>>,
}

impl Fields {
    pub(super) fn from_row(row: &Row) -> Result<Self, FenceError> {
        Ok(Self {
            outcome: row.try_get(0)?,
            token: row.try_get(1)?,
            current_token: row.try_get(2)?,
            current_seq: row.try_get(3)?,
            detail: row.try_get(4)?,
            result: row.try_get(5)?,
        })
    }

    /// The DETAIL and HINT of a BF001 error (see `sql/004_pipelined_fence.sql`).
    pub(super) fn from_error(detail: &str, hint: Option<&str>) -> Result<Self, FenceError> {
        let bad = || FenceError::Corrupt(format!("unreadable pipelined fence outcome {detail:?}"));
        let parts: Vec<&str> = detail.split(',').collect();
        let [outcome, token, current_token, current_seq, result] = parts[..] else {
            return Err(bad());
        };
        let number = |s: &str| -> Result<Option<i64>, FenceError> {
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse().map(Some).map_err(|_| bad())
            }
        };
        let bytes = (0..result.len() / 2)
            .map(|i| u8::from_str_radix(&result[2 * i..2 * i + 2], 16).map_err(|_| bad()))
            .collect::<Result<Vec<u8>, _>>()?;
        Ok(Self {
            outcome: outcome.to_string(),
            token: number(token)?.ok_or_else(bad)?,
            current_token: number(current_token)?,
            current_seq: number(current_seq)?,
            detail: hint.filter(|h| !h.is_empty()).map(str::to_string),
            result: Some(bytes),
        })
    }
}

/// The outcome in `row` of a fence under way, counted.
pub(super) fn outcome(
    req: &FenceRequest,
    row: &Row,
    judging: metrics::Judging,
) -> Result<Outcome, FenceError> {
    outcome_of(req, Fields::from_row(row)?, judging)
}

pub(super) fn outcome_of(
    req: &FenceRequest,
    f: Fields,
    judging: metrics::Judging,
) -> Result<Outcome, FenceError> {
    let t = token(f.token)?;
    let missing = |what: &str| FenceError::Corrupt(format!("{} outcome without {what}", f.outcome));
    let current = || -> Result<FencingToken, FenceError> {
        token(f.current_token.ok_or_else(|| missing("a current token"))?)
    };
    let out = match f.outcome.as_str() {
        "applied" => Outcome::Applied {
            token: t,
            created: f.detail.as_deref() == Some("created"),
        },
        "replayed" => Outcome::Replayed {
            token: t,
            result: f.result.clone().unwrap_or_default(),
        },
        "stale" => Outcome::Stale {
            presented: t,
            current: current()?,
        },
        "conflict" => Outcome::Conflict {
            operation: req.operation.clone(),
            token: t,
        },
        "cancelled" => Outcome::Cancelled {
            presented: t,
            cancelled_at: current()?,
        },
        "deleted" => Outcome::Deleted {
            presented: t,
            floor: current()?,
        },
        "missing" => Outcome::Missing,
        "generation_used" => Outcome::GenerationUsed {
            token: t,
            by_operation: f.detail.clone().unwrap_or_default(),
        },
        "out_of_order" => Outcome::OutOfOrder {
            token: t,
            presented_seq: req.seq,
            current_seq: seq(f.current_seq.ok_or_else(|| missing("a current sequence"))?)?,
        },
        other => return Err(FenceError::Corrupt(format!("unknown outcome {other:?}"))),
    };
    metrics::record(req, &out, judging);
    Ok(out)
}

pub(super) type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// The parameters of `baton.fence_impl` and `baton.fence_or_abort_impl`,
/// held by value so that both calls can borrow them.
pub(super) struct FenceArgs<'a> {
    req: &'a FenceRequest,
    resource: &'a str,
    token: i64,
    operation: &'a str,
    fingerprint: &'a [u8],
    seq: i64,
    policy: i16,
}

impl<'a> FenceArgs<'a> {
    pub(super) fn new(req: &'a FenceRequest) -> Self {
        Self {
            req,
            resource: req.resource.as_str(),
            token: req.token.bigint(),
            operation: req.operation.as_str(),
            fingerprint: req.fingerprint.as_bytes(),
            seq: req.seq.get(),
            policy: req.policy.code(),
        }
    }

    /// The parameters of `baton.fence_shared_impl`: no sequence.
    pub(super) fn shared_params(&self) -> [Param<'_>; 7] {
        [
            &self.resource,
            &self.token,
            &self.operation,
            &self.fingerprint,
            &self.req.result,
            &self.policy,
            &self.req.must_exist,
        ]
    }

    pub(super) fn params(&self) -> [Param<'_>; 8] {
        [
            &self.resource,
            &self.token,
            &self.operation,
            &self.fingerprint,
            &self.req.result,
            &self.seq,
            &self.policy,
            &self.req.must_exist,
        ]
    }
}
