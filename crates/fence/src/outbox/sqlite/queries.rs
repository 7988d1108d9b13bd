//! What the outbox holds, read without changing it: deliveries due, a
//! filtered list, one delivery, its payload and its history.

use super::*;

impl SqliteOutbox {
    /// [`super::postgres::PgOutbox::due`].
    pub fn due(conn: &Connection, limit: u32) -> Result<Vec<Delivery>, FenceError> {
        let sql = format!(
            "SELECT {} FROM baton_outbox
             WHERE state IN ('pending', 'claimed', 'sending', 'accepted') AND next_attempt_ms <= {NOW_MS}
             ORDER BY next_attempt_ms, id LIMIT ?1",
            columns()
        );
        let limit = Filter {
            limit,
            ..Filter::default()
        }
        .limit();
        Ok(conn
            .prepare(&sql)?
            .query_map([limit], delivery)?
            .collect::<Result<_, _>>()?)
    }

    /// [`super::postgres::PgOutbox::list`].
    pub fn list(conn: &Connection, filter: &Filter) -> Result<Vec<Delivery>, FenceError> {
        let sql = format!(
            "SELECT {} FROM baton_outbox
             WHERE (?1 IS NULL OR state = ?1) AND substr(resource, 1, length(?2)) = ?2
             ORDER BY id LIMIT ?3",
            columns()
        );
        let state = filter.state.map(|s| s.as_str());
        Ok(conn
            .prepare(&sql)?
            .query_map(
                params![state, filter.resource_prefix, filter.limit()],
                delivery,
            )?
            .collect::<Result<_, _>>()?)
    }

    /// [`super::postgres::PgOutbox::get`].
    pub fn get(conn: &Connection, id: i64) -> Result<Option<Delivery>, FenceError> {
        let sql = format!("SELECT {} FROM baton_outbox WHERE id = ?1", columns());
        Ok(conn.query_row(&sql, [id], delivery).optional()?)
    }

    /// [`super::postgres::PgOutbox::payload`].
    pub fn payload(conn: &Connection, id: i64) -> Result<Option<Vec<u8>>, FenceError> {
        Ok(conn
            .query_row(
                "SELECT payload FROM baton_outbox WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// [`super::postgres::PgOutbox::events`].
    pub fn events(conn: &Connection, id: i64) -> Result<Vec<DeliveryEvent>, FenceError> {
        let sql = format!(
            "SELECT {}, token, actor, event, detail FROM baton_outbox_events WHERE outbox_id = ?1 ORDER BY id",
            at("at_ms")
        );
        Ok(conn
            .prepare(&sql)?
            .query_map([id], |r| {
                Ok(DeliveryEvent {
                    at: r.get(0)?,
                    token: r.get(1)?,
                    actor: r.get(2)?,
                    event: r.get(3)?,
                    detail: r.get(4)?,
                })
            })?
            .collect::<Result<_, _>>()?)
    }
}
