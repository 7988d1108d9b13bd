//! `baton bench`: the client flags turned into the load generator's
//! endpoint; the harness itself is `baton_bench::command`.

use baton_bench::command::{BenchError, Endpoint};

use crate::args::BenchArgs;
use crate::error::{CliError, Exit};

/// Runs the load generator against the server of the client flags.
pub async fn bench(a: BenchArgs) -> Result<Exit, CliError> {
    let endpoint = Endpoint {
        server: a.client.server.clone(),
        options: crate::lease::connect_options(&a.client)?,
        token_file: a.client.token_file.clone(),
        rpc_timeout: a.client.timeout,
        baton: std::env::current_exe()
            .map_err(|e| CliError::failure(format!("bench: this executable's path: {e}")))?,
    };
    baton_bench::command::run(&a.bench, &endpoint, a.client.json)
        .await
        .map_err(|e| match e {
            BenchError::Usage(m) => CliError::usage(m),
            failed @ BenchError::Failed(_) => CliError::failure(failed.to_string()),
        })?;
    Ok(Exit::Ok)
}
