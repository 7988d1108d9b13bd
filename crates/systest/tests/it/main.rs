//! The integration tests of this crate, one binary with a module per
//! subject: a change re-links one test binary, not one per file.

mod blockers;
mod cluster;
mod crash;
mod crash_events;
mod crash_expiry;
mod election;
mod gate;
mod hardening;
mod http_port;
mod lost_answers;
mod names;
mod page;
mod quota;
mod reach;
mod restore;
mod resume;
mod security;
mod server;
mod session;
mod shapes;
mod watch;
mod worker;
