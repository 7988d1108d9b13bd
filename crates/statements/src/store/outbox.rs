//! The fence kit's outbox in this service's database, whichever it is.

use baton_fence::outbox::postgres::PgOutbox;
use baton_fence::outbox::sqlite::SqliteOutbox;
use baton_fence::outbox::{Delivery, DeliveryEvent, Filter, Report, Resolution, Step};
use baton_fence::FencingToken;

use super::{err, Result};

/// The outbox's calls on one connection.
pub enum Outbox<'a> {
    Postgres(&'a tokio_postgres::Client),
    Sqlite(&'a mut rusqlite::Connection),
}

impl Outbox<'_> {
    pub async fn due(&mut self, limit: u32) -> Result<Vec<Delivery>> {
        match self {
            Outbox::Postgres(c) => PgOutbox::due(*c, limit).await,
            Outbox::Sqlite(c) => SqliteOutbox::due(c, limit),
        }
        .map_err(err)
    }

    pub async fn claim(&mut self, id: i64, token: FencingToken, by: &str) -> Result<Step> {
        match self {
            Outbox::Postgres(c) => PgOutbox::claim(*c, id, token, by).await,
            Outbox::Sqlite(c) => SqliteOutbox::claim(c, id, token, by),
        }
        .map_err(err)
    }

    pub async fn begin_send(&mut self, id: i64, token: FencingToken) -> Result<Step> {
        match self {
            Outbox::Postgres(c) => PgOutbox::begin_send(*c, id, token).await,
            Outbox::Sqlite(c) => SqliteOutbox::begin_send(c, id, token),
        }
        .map_err(err)
    }

    pub async fn record(
        &mut self,
        id: i64,
        token: FencingToken,
        report: Report,
        evidence: &str,
    ) -> Result<Step> {
        match self {
            Outbox::Postgres(c) => PgOutbox::record(*c, id, token, report, evidence).await,
            Outbox::Sqlite(c) => SqliteOutbox::record(c, id, token, report, evidence),
        }
        .map_err(err)
    }

    pub async fn confirm(
        &mut self,
        operation: &str,
        delivered: bool,
        evidence: &str,
    ) -> Result<Step> {
        match self {
            Outbox::Postgres(c) => PgOutbox::confirm(*c, operation, delivered, evidence).await,
            Outbox::Sqlite(c) => SqliteOutbox::confirm(c, operation, delivered, evidence),
        }
        .map_err(err)
    }

    pub async fn resolve(
        &mut self,
        id: i64,
        resolution: Resolution,
        actor: &str,
        reason: &str,
    ) -> Result<Step> {
        match self {
            Outbox::Postgres(c) => PgOutbox::resolve(*c, id, resolution, actor, reason).await,
            Outbox::Sqlite(c) => SqliteOutbox::resolve(c, id, resolution, actor, reason),
        }
        .map_err(err)
    }

    pub async fn list(&mut self, filter: &Filter) -> Result<Vec<Delivery>> {
        match self {
            Outbox::Postgres(c) => PgOutbox::list(*c, filter).await,
            Outbox::Sqlite(c) => SqliteOutbox::list(c, filter),
        }
        .map_err(err)
    }

    pub async fn get(&mut self, id: i64) -> Result<Option<Delivery>> {
        match self {
            Outbox::Postgres(c) => PgOutbox::get(*c, id).await,
            Outbox::Sqlite(c) => SqliteOutbox::get(c, id),
        }
        .map_err(err)
    }

    pub async fn payload(&mut self, id: i64) -> Result<Option<Vec<u8>>> {
        match self {
            Outbox::Postgres(c) => PgOutbox::payload(*c, id).await,
            Outbox::Sqlite(c) => SqliteOutbox::payload(c, id),
        }
        .map_err(err)
    }

    pub async fn events(&mut self, id: i64) -> Result<Vec<DeliveryEvent>> {
        match self {
            Outbox::Postgres(c) => PgOutbox::events(*c, id).await,
            Outbox::Sqlite(c) => SqliteOutbox::events(c, id),
        }
        .map_err(err)
    }
}
