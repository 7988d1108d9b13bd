//! Fenced publication vs a plain UPDATE on the same PostgreSQL, side by side.
//!
//! ```sh
//! cargo run --release -p baton-fence --example pg_bench -- "host=127.0.0.1 user=postgres dbname=test" 3
//! ```
//!
//! For 1 and 16 connections, each on its own rows, for N seconds each, in
//! three interleaved rounds: a plain single-row `UPDATE` in its own
//! transaction; `baton.publish` (check, generation advance, operation record
//! and pointer move in one statement); and the generic path (BEGIN, fence,
//! the caller's UPDATE, COMMIT: four round trips); and the pipelined generic
//! path (`PgFence::write_pipelined`: BEGIN, fence and UPDATE in one round
//! trip, COMMIT in a second). Prints operations per second (median of the
//! rounds) and the ratios to the plain UPDATE.

use std::time::{Duration, Instant};

use baton_fence::postgres::PgFence;
use baton_fence::{FenceError, FenceRequest, FencingToken};
use tokio_postgres::{Client, NoTls};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Plain,
    Publish,
    Generic,
    Pipelined,
}

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(conn);
    c
}

async fn run(url: &str, kind: Kind, clients: usize, seconds: f64, round: usize) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = connect(url).await;
        tasks.push(tokio::spawn(async move {
            let plain = client
                .prepare("UPDATE bench_plain SET v = $2 WHERE id = $1")
                .await
                .unwrap();
            let effect = client
                .prepare("UPDATE bench_plain SET v = $2 WHERE id = $1")
                .await
                .unwrap();
            let prepared = PgFence::prepare(&client).await.unwrap();
            let id = c as i64;
            let resource = format!("bench:{clients}:{round}:{kind:?}:{c}");
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                n += 1;
                let token = n;
                match kind {
                    Kind::Plain => {
                        client.execute(&plain, &[&id, &(n as i64)]).await.unwrap();
                    }
                    Kind::Publish => {
                        let key = format!("statements/{resource}/generation-{token}.pdf");
                        let req = FenceRequest::new(
                            &resource,
                            FencingToken::of(token).unwrap(),
                            &format!("op-{n}"),
                            b"fingerprint",
                            key.as_bytes(),
                        )
                        .unwrap();
                        assert!(PgFence::publish(&client, &prepared, &req)
                            .await
                            .unwrap()
                            .is_applied());
                    }
                    Kind::Generic => {
                        let req = FenceRequest::new(
                            &resource,
                            FencingToken::of(token).unwrap(),
                            &format!("op-{n}"),
                            b"fingerprint",
                            b"r",
                        )
                        .unwrap();
                        let tx = client.transaction().await.unwrap();
                        let out = PgFence::fence_with(&tx, &prepared, &req).await.unwrap();
                        assert!(out.is_applied());
                        tx.execute(&effect, &[&id, &(n as i64)])
                            .await
                            .map_err(FenceError::from)
                            .unwrap();
                        tx.commit().await.unwrap();
                    }
                    Kind::Pipelined => {
                        let req = FenceRequest::new(
                            &resource,
                            FencingToken::of(token).unwrap(),
                            &format!("op-{n}"),
                            b"fingerprint",
                            b"r",
                        )
                        .unwrap();
                        let out = PgFence::write_pipelined(
                            &client,
                            &prepared,
                            &req,
                            &effect,
                            &[&id, &(n as i64)],
                        )
                        .await
                        .unwrap();
                        assert!(out.is_applied());
                    }
                }
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / seconds
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "host=127.0.0.1 user=postgres dbname=test".into());
    let seconds: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let mut setup = connect(&url).await;
    PgFence::migrate(&mut setup).await.unwrap();
    setup
        .batch_execute(
            "DROP TABLE IF EXISTS bench_plain;
             CREATE TABLE bench_plain (id bigint PRIMARY KEY, v bigint NOT NULL);
             INSERT INTO bench_plain SELECT g, 0 FROM generate_series(0, 63) g;
             DELETE FROM baton.operations WHERE resource LIKE 'bench:%';
             DELETE FROM baton.resources WHERE resource LIKE 'bench:%';",
        )
        .await
        .unwrap();
    let show = setup
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get::<_, String>(0);
    println!("PostgreSQL synchronous_commit={show}; {seconds}s per measurement, 3 rounds, median");
    println!(
        "{:>3} {:>10} {:>10} {:>10} {:>10} {:>14} {:>14} {:>16}",
        "C",
        "plain/s",
        "publish/s",
        "generic/s",
        "pipelined/s",
        "publish/plain",
        "generic/plain",
        "pipelined/plain"
    );
    for clients in [1, 16] {
        let (mut plain, mut publish, mut generic, mut pipelined) = (vec![], vec![], vec![], vec![]);
        for round in 0..3 {
            plain.push(run(&url, Kind::Plain, clients, seconds, round).await);
            publish.push(run(&url, Kind::Publish, clients, seconds, round).await);
            generic.push(run(&url, Kind::Generic, clients, seconds, round).await);
            pipelined.push(run(&url, Kind::Pipelined, clients, seconds, round).await);
        }
        let (p, f, g, q) = (
            median(plain),
            median(publish),
            median(generic),
            median(pipelined),
        );
        println!(
            "{clients:>3} {p:>10.0} {f:>10.0} {g:>10.0} {q:>10.0} {:>14.2} {:>14.2} {:>16.2}",
            f / p,
            g / p,
            q / p
        );
    }
    setup
        .batch_execute(
            "DROP TABLE bench_plain;
             DELETE FROM baton.operations WHERE resource LIKE 'bench:%';
             DELETE FROM baton.resources WHERE resource LIKE 'bench:%';",
        )
        .await
        .unwrap();
}
