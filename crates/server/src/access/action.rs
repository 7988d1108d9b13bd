//! What a caller asks to do, as the gate, the audit log and refusal
//! messages name it: one name per operation, whatever the transport (a
//! session's acquire is `acquire`, like the unary call's).

use std::fmt;

/// An operation a caller is let in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Acquire,
    Renew,
    Release,
    Status,
    List,
    Fence,
    SetPermits,
    Watch,
    Backup,
    ClusterStatus,
    SessionOpen,
    SessionHeartbeat,
    SessionClose,
    SessionCancel,
    PageRead,
    PageList,
    PageHistory,
    MetricsScrape,
}

impl Action {
    /// The name in audit lines (`"action"`) and in refusals ("may not ...").
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Acquire => "acquire",
            Action::Renew => "renew",
            Action::Release => "release",
            Action::Status => "status",
            Action::List => "list",
            Action::Fence => "fence",
            Action::SetPermits => "set_permits",
            Action::Watch => "watch",
            Action::Backup => "backup",
            Action::ClusterStatus => "cluster_status",
            Action::SessionOpen => "session_open",
            Action::SessionHeartbeat => "session_heartbeat",
            Action::SessionClose => "session_close",
            Action::SessionCancel => "session_cancel",
            Action::PageRead => "page_read",
            Action::PageList => "page_list",
            Action::PageHistory => "page_history",
            Action::MetricsScrape => "metrics_scrape",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
