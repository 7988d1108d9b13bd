//! Addresses: the proxies in front of Baton and PostgreSQL.

use std::net::SocketAddr;
use std::str::FromStr;

use baton_faults::Direction;

pub fn direction(to_server: bool) -> Direction {
    if to_server {
        Direction::ClientToServer
    } else {
        Direction::ServerToClient
    }
}

/// A free port for the Baton server, below the kernel's ephemeral range.
///
/// The server gives its port up whenever it is killed, and must get it
/// back. A port from the ephemeral range could meanwhile be handed to any
/// socket bound to port 0 (this run's proxies, a parallel run's), and the
/// server would never start again; ports below the range are only ever
/// taken by name.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let (first, last) = (10_000u16, low.saturating_sub(1).max(10_001));
    let span = u32::from(last - first);
    // Where to start looking: differs between runs started together.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % span;
    for i in 0..span {
        let port = first + ((start + i) % span) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?);
        }
    }
    anyhow::bail!("no free port between {first} and {last} for the Baton server")
}

/// The worker's connection string with the host and port of its proxy (the
/// port left as `{port}`), and the database's own address.
pub async fn postgres_via_proxy(url: &str) -> anyhow::Result<(String, SocketAddr)> {
    let config = tokio_postgres::Config::from_str(url).map_err(|e| {
        anyhow::anyhow!("--database-url is not a PostgreSQL connection string: {e}")
    })?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => {
            anyhow::bail!("chaos puts a proxy in front of PostgreSQL, so --database-url needs a TCP host (host=127.0.0.1, not a socket directory)")
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {host}"))?;
    let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut out = String::from("host=127.0.0.1 port={port}");
    if let Some(user) = config.get_user() {
        out += &format!(" user={}", quote(user));
    }
    if let Some(db) = config.get_dbname() {
        out += &format!(" dbname={}", quote(db));
    }
    if let Some(pw) = config.get_password() {
        out += &format!(" password={}", quote(&String::from_utf8_lossy(pw)));
    }
    Ok((out, upstream))
}
