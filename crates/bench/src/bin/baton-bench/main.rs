//! `baton-bench`: the `baton bench` cycle, run side by side against Baton,
//! Redis (SET NX PX, INCR for a token, compare-and-delete), etcd's lock API
//! and PostgreSQL advisory locks. A peer that is not running is reported as
//! such and skipped; Baton must be running.

mod etcd;
mod pg;
mod redis;

use std::time::Duration;

use baton_bench::{parse_clients, run, Baton, Mode, Report, Target};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Acquire/release cycles against Baton and its peers, side by side")]
struct Args {
    /// Baton server.
    #[arg(long, default_value = "http://127.0.0.1:7700")]
    server: String,
    /// Redis address (host:port); empty to skip.
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis: String,
    /// Measure Redis once per appendfsync mode (always, everysec) by setting
    /// it with CONFIG SET, restoring the previous settings afterwards.
    #[arg(long)]
    redis_aof_modes: bool,
    /// etcd gRPC endpoint; empty to skip.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// PostgreSQL connection string for advisory locks; empty to skip.
    #[arg(long, default_value = "host=127.0.0.1 user=postgres dbname=test")]
    postgres: String,
    /// Client counts.
    #[arg(long, default_value = "1,16,64")]
    clients: String,
    /// Time per measurement, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Lease TTL in seconds.
    #[arg(long, default_value_t = 30)]
    ttl_s: u64,
    /// Modes: distinct, shared or both.
    #[arg(long, default_value = "both")]
    modes: String,
}

async fn measure<T: Target>(
    target: &T,
    args: &Args,
    clients: &[usize],
    modes: &[Mode],
    run_id: &str,
) {
    let duration = Duration::from_secs_f64(args.seconds);
    for &mode in modes {
        for &c in clients {
            match run(target, mode, c, duration, run_id).await {
                Ok(report) => println!("{}", report.line()),
                Err(e) => println!(
                    "{:<26} {:<9} {:>4} failed: {e}",
                    target.name(),
                    mode.label(),
                    c
                ),
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let clients = match parse_clients(&args.clients) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --clients: {e}");
            std::process::exit(2);
        }
    };
    let modes = match args.modes.as_str() {
        "distinct" => vec![Mode::Distinct],
        "shared" => vec![Mode::Shared],
        _ => vec![Mode::Distinct, Mode::Shared],
    };
    let run_id = format!("{}", std::process::id());
    println!("{}", Report::header());
    let baton = Baton {
        url: args.server.clone(),
        ttl: Duration::from_secs(args.ttl_s),
    };
    measure(&baton, &args, &clients, &modes, &run_id).await;

    if !args.redis.is_empty() {
        match redis::Redis::probe(&args.redis).await {
            Err(e) => println!("redis at {}: not running ({e}); skipped", args.redis),
            Ok(()) if args.redis_aof_modes => {
                let saved = redis::aof_settings(&args.redis).await;
                for mode in ["always", "everysec"] {
                    if let Err(e) = redis::set_aof(&args.redis, mode).await {
                        println!("redis: cannot set appendfsync {mode}: {e}");
                        continue;
                    }
                    let target =
                        redis::Redis::new(&args.redis, &format!("redis aof={mode}"), args.ttl_s);
                    measure(&target, &args, &clients, &modes, &run_id).await;
                }
                if let Ok((appendonly, fsync)) = saved {
                    let _ = redis::restore_aof(&args.redis, &appendonly, &fsync).await;
                }
            }
            Ok(()) => {
                let target = redis::Redis::new(&args.redis, "redis", args.ttl_s);
                measure(&target, &args, &clients, &modes, &run_id).await;
            }
        }
    }
    if !args.etcd.is_empty() {
        match etcd::Etcd::probe(&args.etcd).await {
            Err(e) => println!("etcd at {}: not running ({e}); skipped", args.etcd),
            Ok(target) => measure(&target, &args, &clients, &modes, &run_id).await,
        }
    }
    if !args.postgres.is_empty() {
        match pg::Advisory::probe(&args.postgres).await {
            Err(e) => println!("postgres advisory locks: not reachable ({e}); skipped"),
            Ok(target) => measure(&target, &args, &clients, &modes, &run_id).await,
        }
    }
}
