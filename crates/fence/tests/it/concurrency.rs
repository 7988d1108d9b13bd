//! Many connections write one resource with random tokens at once. Whatever
//! the interleaving, the recorded generation ends at the largest applied
//! token and the effects, in commit order, carry strictly increasing tokens:
//! no writer got through between another's check and write.

use baton_fence::postgres::PgFence;
use baton_fence::sqlite::SqliteFence;
use baton_fence::{resource_name, FenceError, FenceRequest, FencingToken, Outcome};

const WRITERS: u64 = 8;
const WRITES_EACH: u64 = 40;

/// Seeded per writer: rising with jitter, so writers overtake each other often.
fn tokens(seed: u64) -> Vec<u64> {
    let mut rng = baton_client::rng::Rng::new(seed);
    (0..WRITES_EACH)
        .map(|i| i * 10 + rng.below(40) + 1)
        .collect()
}

fn request(writer: u64, i: u64, token: u64) -> FenceRequest {
    FenceRequest::new(
        "hot",
        FencingToken::of(token).unwrap(),
        &format!("w{writer}-{i}"),
        b"payload",
        b"r",
    )
    .unwrap()
}

fn check(applied: &[(i64, i64)], generation: i64, n_stale: usize) {
    assert!(!applied.is_empty());
    for pair in applied.windows(2) {
        assert!(
            pair[0].1 < pair[1].1,
            "effects out of token order: {pair:?}"
        );
    }
    assert_eq!(
        applied.last().unwrap().1,
        generation,
        "generation is the largest applied token"
    );
    println!(
        "{} writes applied, {n_stale} refused as stale or same generation",
        applied.len()
    );
    assert!(
        n_stale > 0,
        "the race never happened; the test proved nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_writers_cannot_slip_past_the_check() {
    let db = baton_testkit::PgDb::create("baton_fence_conc").await;
    let connect = || db.connect();
    let mut setup = connect().await;
    PgFence::migrate(&mut setup).await.unwrap();
    setup
        .batch_execute("CREATE TABLE effects (id bigserial PRIMARY KEY, token bigint)")
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut client = connect().await;
        tasks.push(tokio::spawn(async move {
            let mut refused = 0;
            for (i, token) in tokens(w + 1).into_iter().enumerate() {
                let req = request(w, i as u64, token);
                let out = PgFence::write(&mut client, &req, async |tx| {
                    tx.execute(
                        "INSERT INTO effects (token) VALUES ($1)",
                        &[&req.token.bigint()],
                    )
                    .await?;
                    Ok::<(), FenceError>(())
                })
                .await
                .unwrap();
                if matches!(out, Outcome::Stale { .. } | Outcome::GenerationUsed { .. }) {
                    refused += 1;
                }
            }
            refused
        }));
    }
    let mut n_stale = 0;
    for t in tasks {
        n_stale += t.await.unwrap();
    }
    let applied: Vec<(i64, i64)> = setup
        .query("SELECT id, token FROM effects ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let generation = PgFence::state(&setup, &resource_name("hot").unwrap())
        .await
        .unwrap()
        .unwrap()
        .generation
        .bigint();

    // Negative control: read the generation, compare in application code,
    // then write unconditionally (with a short pause in between, as a GC
    // pause or slow network would). The same check must catch it.
    setup.batch_execute("CREATE TABLE naive_state (id int PRIMARY KEY, generation bigint); INSERT INTO naive_state VALUES (1, 0); CREATE TABLE naive_effects (id bigserial PRIMARY KEY, token bigint)").await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut client = connect().await;
        tasks.push(tokio::spawn(async move {
            for token in tokens(w + 1) {
                let tx = client.transaction().await.unwrap();
                let current: i64 = tx
                    .query_one("SELECT generation FROM naive_state WHERE id = 1", &[])
                    .await
                    .unwrap()
                    .get(0);
                if (token as i64) > current {
                    tx.execute("SELECT pg_sleep(0.001)", &[]).await.unwrap();
                    tx.execute(
                        "UPDATE naive_state SET generation = $1 WHERE id = 1",
                        &[&(token as i64)],
                    )
                    .await
                    .unwrap();
                    tx.execute(
                        "INSERT INTO naive_effects (token) VALUES ($1)",
                        &[&(token as i64)],
                    )
                    .await
                    .unwrap();
                }
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let naive: Vec<i64> = setup
        .query("SELECT token FROM naive_effects ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let regressions = naive.windows(2).filter(|p| p[0] >= p[1]).count();
    println!(
        "negative control: read-compare-write let {regressions} stale writes through out of {}",
        naive.len()
    );
    drop(setup);
    check(&applied, generation, n_stale);
    assert!(regressions > 0, "the unfenced control showed no race: this test cannot tell a broken fence from a working one");
}

#[test]
fn sqlite_concurrent_writers_cannot_slip_past_the_check() {
    let path = std::env::temp_dir().join(format!("baton_fence_conc_{}.sqlite", std::process::id()));
    let open = || {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.busy_timeout(std::time::Duration::from_secs(30)).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c
    };
    let setup = open();
    SqliteFence::migrate(&setup).unwrap();
    setup
        .execute_batch("CREATE TABLE effects (id INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER)")
        .unwrap();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let mut conn = open();
            std::thread::spawn(move || {
                let mut refused = 0;
                for (i, token) in tokens(w + 1).into_iter().enumerate() {
                    let req = request(w, i as u64, token);
                    let out = SqliteFence::write(&mut conn, &req, |tx| {
                        tx.execute(
                            "INSERT INTO effects (token) VALUES (?1)",
                            [req.token.bigint()],
                        )?;
                        Ok::<(), FenceError>(())
                    })
                    .unwrap();
                    if matches!(out, Outcome::Stale { .. } | Outcome::GenerationUsed { .. }) {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    let n_stale = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let mut stmt = setup
        .prepare("SELECT id, token FROM effects ORDER BY id")
        .unwrap();
    let applied: Vec<(i64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let generation = SqliteFence::state(&setup, &resource_name("hot").unwrap())
        .unwrap()
        .unwrap()
        .generation
        .bigint();
    drop(stmt);
    drop(setup);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    check(&applied, generation, n_stale);
}

/// Many connections publish to one resource at once, and every publish is
/// sent twice, by two connections racing each other (a retry that crossed
/// the original). Each operation is applied at most once, its twin is told
/// it was replayed (or stale), nobody gets an error, and the pointer ends at
/// the highest applied token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_racing_publishes_and_their_replays_apply_once() {
    let db = baton_testkit::PgDb::create("baton_fence_pubrace").await;
    let mut setup = db.connect().await;
    PgFence::migrate(&mut setup).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = db.connect().await;
        tasks.push(tokio::spawn(async move {
            let prepared = PgFence::prepare(&client).await.unwrap();
            let mut seen = Vec::new();
            // Writers 2k and 2k+1 send the same operations in the same order.
            for (i, token) in tokens(w / 2 + 1).into_iter().enumerate() {
                let key = format!("obj/{}-{i}-{token}", w / 2);
                let req = FenceRequest::new(
                    "pub-hot",
                    FencingToken::of(token).unwrap(),
                    &format!("p{}-{i}", w / 2),
                    b"fp",
                    key.as_bytes(),
                )
                .unwrap();
                let out = PgFence::publish(&client, &prepared, &req).await.unwrap();
                seen.push((req.operation.as_str().to_string(), token, out));
            }
            seen
        }));
    }
    let mut applied = std::collections::BTreeMap::new();
    let (mut replayed, mut refused) = (0, 0);
    for t in tasks {
        for (op, token, out) in t.await.unwrap() {
            match out {
                Outcome::Applied { .. } => {
                    assert!(
                        applied.insert(op.clone(), token).is_none(),
                        "{op} applied twice"
                    );
                }
                Outcome::Replayed { .. } => replayed += 1,
                Outcome::Stale { .. } | Outcome::GenerationUsed { .. } => refused += 1,
                other => panic!("{op}: unexpected outcome {other:?}"),
            }
        }
    }
    let pointer: i64 = setup
        .query_one(
            "SELECT published_token FROM baton.resources WHERE resource = 'pub-hot'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let recorded: i64 = setup
        .query_one(
            "SELECT count(*) FROM baton.operations WHERE resource = 'pub-hot'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    println!(
        "{} publishes applied, {replayed} replays, {refused} refused",
        applied.len()
    );
    assert_eq!(pointer as u64, *applied.values().max().unwrap());
    assert_eq!(
        recorded as usize,
        applied.len(),
        "one record per applied operation, none left by a refusal"
    );
    assert!(
        replayed > 0,
        "no twin ever raced its original: the test proved nothing"
    );
}
