//! `baton cluster status`: the cluster as a server sees it.

use serde::Serialize;

use crate::args::ClientOpts;
use crate::error::CliError;
use crate::lease::connect;
use crate::output::Rendered;

/// One member line.
#[derive(Serialize)]
pub struct MemberOut {
    node: String,
    advertise: String,
    seen_ms_ago: u64,
    leader: bool,
}

/// What `cluster status` prints.
#[derive(Serialize)]
pub struct ClusterOut {
    clustered: bool,
    asked: String,
    node: String,
    role: String,
    cluster: String,
    term: u64,
    leader: String,
    members: Vec<MemberOut>,
}

impl Rendered for ClusterOut {
    fn text(&self) -> String {
        if !self.clustered {
            return format!(
                "{} is a single server on its embedded store (node {}), always the leader",
                self.asked, self.node
            );
        }
        let leader = if self.leader.is_empty() {
            "none known (election under way)"
        } else {
            &self.leader
        };
        let mut out = format!(
            "cluster {}: leader {leader}, term {}\nasked {} (node {}, {})\n",
            self.cluster, self.term, self.asked, self.node, self.role
        );
        for m in &self.members {
            out += &format!(
                "  {:<16} {:<30} seen {:>6} ms ago{}\n",
                m.node,
                m.advertise,
                m.seen_ms_ago,
                if m.leader { "  leader" } else { "" }
            );
        }
        out.trim_end().to_string()
    }
}

/// Asks the first reachable `--server` address.
pub async fn status(opts: &ClientOpts) -> Result<ClusterOut, CliError> {
    let mut client = connect(opts).await?;
    let asked = client.current_server();
    let s = client.cluster_status().await?;
    Ok(ClusterOut {
        clustered: s.clustered,
        asked,
        node: s.node,
        role: s.role,
        cluster: s.cluster,
        term: s.term,
        leader: s.leader,
        members: s
            .members
            .into_iter()
            .map(|m| MemberOut {
                node: m.node,
                advertise: m.advertise,
                seen_ms_ago: m.seen_ms_ago,
                leader: m.leader,
            })
            .collect(),
    })
}
