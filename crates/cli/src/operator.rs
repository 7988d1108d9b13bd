//! The operator's commands on a resource: `fence` (revoke every holder,
//! a token above all of theirs) and `permits` (a semaphore's N).

use serde::Serialize;

use crate::args::ClientOpts;
use crate::error::CliError;
use crate::lease::connect;
use crate::output::Rendered;

/// What `fence` prints.
#[derive(Serialize)]
pub struct FenceOut {
    resource: String,
    token: u64,
    revoked_token: Option<u64>,
}

impl Rendered for FenceOut {
    fn text(&self) -> String {
        let revoked = self
            .revoked_token
            .map_or("no lease was held".to_string(), |t| {
                format!("revoked token {t}")
            });
        format!("fenced {} token={} ({revoked})", self.resource, self.token)
    }
}

/// What `permits` prints.
#[derive(Serialize)]
pub struct PermitsOut {
    resource: String,
    permits: u32,
    previous: u32,
}

impl Rendered for PermitsOut {
    fn text(&self) -> String {
        format!(
            "{} is a semaphore of {} permits (was {})",
            self.resource, self.permits, self.previous
        )
    }
}

/// `baton permits`.
pub async fn set_permits(
    opts: &ClientOpts,
    name: &str,
    permits: u32,
) -> Result<PermitsOut, CliError> {
    let mut client = connect(opts).await?;
    let previous = client.set_permits(name, permits).await?;
    Ok(PermitsOut {
        resource: name.into(),
        permits,
        previous,
    })
}

/// `baton fence`.
pub async fn fence(opts: &ClientOpts, name: &str) -> Result<FenceOut, CliError> {
    let mut client = connect(opts).await?;
    let f = client.fence(name).await?;
    Ok(FenceOut {
        resource: name.into(),
        token: f.token.get(),
        revoked_token: f.revoked.map(|t| t.get()),
    })
}
