//! The fence kit's SQL, compiled in: the migrations (the history) and the
//! definition in force of every function.

/// The migrations that install and upgrade the `baton` schema, tables and
/// functions, by version. Each runs once, in order, recorded in
/// `baton.schema_migrations`. From psql, `sql/install.sql` runs those a
/// database lacks and then the function files, in one transaction.
pub const MIGRATIONS: [(i32, &str); 10] = [
    (1, include_str!("../../sql/001_baton_fence.sql")),
    (2, include_str!("../../sql/002_names_and_races.sql")),
    (3, include_str!("../../sql/003_documented_names.sql")),
    (4, include_str!("../../sql/004_pipelined_fence.sql")),
    (5, include_str!("../../sql/005_publish_hot_path.sql")),
    (6, include_str!("../../sql/006_plpgsql_wrappers.sql")),
    (7, include_str!("../../sql/007_plain_names.sql")),
    (8, include_str!("../../sql/008_outbox.sql")),
    (9, include_str!("../../sql/009_invisible_names.sql")),
    (10, include_str!("../../sql/010_shared_writes.sql")),
];

/// The definition in force of every `baton.*` function, one file per
/// function (`sql/functions/NAME.sql`), as the migrations leave them:
/// read these to know the rule. `PgFence::migrate` re-applies them after
/// the migrations on every install and upgrade, and so does
/// `sql/install.sql`. A test checks they are exactly what the migrations
/// leave in force.
pub const FUNCTIONS: [(&str, &str); 31] = [
    ("cancel.sql", include_str!("../../sql/functions/cancel.sql")),
    (
        "cancel_impl.sql",
        include_str!("../../sql/functions/cancel_impl.sql"),
    ),
    (
        "check_input.sql",
        include_str!("../../sql/functions/check_input.sql"),
    ),
    (
        "check_name.sql",
        include_str!("../../sql/functions/check_name.sql"),
    ),
    (
        "check_policy.sql",
        include_str!("../../sql/functions/check_policy.sql"),
    ),
    (
        "check_token.sql",
        include_str!("../../sql/functions/check_token.sql"),
    ),
    ("delete.sql", include_str!("../../sql/functions/delete.sql")),
    (
        "delete_impl.sql",
        include_str!("../../sql/functions/delete_impl.sql"),
    ),
    ("fence.sql", include_str!("../../sql/functions/fence.sql")),
    (
        "fence_full.sql",
        include_str!("../../sql/functions/fence_full.sql"),
    ),
    (
        "fence_impl.sql",
        include_str!("../../sql/functions/fence_impl.sql"),
    ),
    (
        "fence_or_abort.sql",
        include_str!("../../sql/functions/fence_or_abort.sql"),
    ),
    (
        "fence_or_abort_impl.sql",
        include_str!("../../sql/functions/fence_or_abort_impl.sql"),
    ),
    (
        "fence_shared.sql",
        include_str!("../../sql/functions/fence_shared.sql"),
    ),
    (
        "fence_shared_impl.sql",
        include_str!("../../sql/functions/fence_shared_impl.sql"),
    ),
    (
        "name_is_plain.sql",
        include_str!("../../sql/functions/name_is_plain.sql"),
    ),
    (
        "outbox_begin_send.sql",
        include_str!("../../sql/functions/outbox_begin_send.sql"),
    ),
    (
        "outbox_cancel.sql",
        include_str!("../../sql/functions/outbox_cancel.sql"),
    ),
    (
        "outbox_claim.sql",
        include_str!("../../sql/functions/outbox_claim.sql"),
    ),
    (
        "outbox_confirm.sql",
        include_str!("../../sql/functions/outbox_confirm.sql"),
    ),
    (
        "outbox_enqueue.sql",
        include_str!("../../sql/functions/outbox_enqueue.sql"),
    ),
    (
        "outbox_is_final.sql",
        include_str!("../../sql/functions/outbox_is_final.sql"),
    ),
    (
        "outbox_record.sql",
        include_str!("../../sql/functions/outbox_record.sql"),
    ),
    (
        "outbox_resolve.sql",
        include_str!("../../sql/functions/outbox_resolve.sql"),
    ),
    (
        "policy_code.sql",
        include_str!("../../sql/functions/policy_code.sql"),
    ),
    (
        "prune_operations.sql",
        include_str!("../../sql/functions/prune_operations.sql"),
    ),
    (
        "prune_operations_impl.sql",
        include_str!("../../sql/functions/prune_operations_impl.sql"),
    ),
    (
        "publish.sql",
        include_str!("../../sql/functions/publish.sql"),
    ),
    (
        "publish_impl.sql",
        include_str!("../../sql/functions/publish_impl.sql"),
    ),
    (
        "recreate.sql",
        include_str!("../../sql/functions/recreate.sql"),
    ),
    (
        "recreate_impl.sql",
        include_str!("../../sql/functions/recreate_impl.sql"),
    ),
];
