//! The documented rule for a failing store, through the store seam: a failed
//! commit stops the engine, every caller whose answer depended on it hears
//! "indeterminate" (never a grant that is not durable), and the server stops
//! with an error. And a crash keeps exactly what was committed.

use std::time::Duration;

use baton_client::{Acquired, Client, ClientError};
use baton_server::{start_with_store, ServerConfig, ServerError};
use baton_testkit::store::{FailingStore, MemStore};

const TTL: Duration = Duration::from_secs(30);

fn config() -> ServerConfig {
    ServerConfig::ephemeral(std::env::temp_dir().join("unused-by-start-with-store"))
}

#[tokio::test]
async fn a_failed_commit_stops_the_engine_and_callers_hear_indeterminate() {
    let mem = MemStore::default();
    let (store, switch) = FailingStore::new(mem.clone());
    let mut server = start_with_store(config(), Box::new(store)).await.unwrap();
    let mut client = Client::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let first = match client
        .acquire("a", Some(TTL), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    switch.fail_commits();
    let err = client
        .acquire("b", Some(TTL), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Indeterminate(_)), "{err:?}");
    assert!(!err.is_definite());
    let stopped = tokio::time::timeout(Duration::from_secs(10), server.wait())
        .await
        .expect("the server stops by itself");
    assert!(
        matches!(stopped, Err(ServerError::Engine(_))),
        "{stopped:?}"
    );
    assert_eq!(switch.failures(), 1);
    // Nothing of the failed batch is durable: a restart knows "a" only.
    let durable = mem.durable();
    assert_eq!(durable.leases.len(), 1);
    assert_eq!(durable.leases[0].1.token, first.token);
    assert_eq!(durable.counter, first.token.counter());
}

#[tokio::test]
async fn a_server_restarted_on_the_committed_image_continues_above_it() {
    let mem = MemStore::default();
    let server = start_with_store(config(), Box::new(mem.clone()))
        .await
        .unwrap();
    let mut client = Client::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for name in ["a", "b", "c"] {
        match client
            .acquire(name, Some(TTL), Duration::ZERO)
            .await
            .unwrap()
        {
            Acquired::Granted(l) => tokens.push(l),
            other => panic!("{other:?}"),
        }
    }
    drop(client);
    server.shutdown().await.unwrap();
    let restarted = start_with_store(config(), Box::new(mem.clone()))
        .await
        .unwrap();
    let mut client = Client::connect(&format!("http://{}", restarted.grpc_addr))
        .await
        .unwrap();
    // The holder of "a" still proves ownership; "d" gets a token above all.
    assert!(matches!(
        client.renew("a", &tokens[0].acquisition_id).await.unwrap(),
        baton_client::Renewal::Renewed { .. }
    ));
    let d = match client
        .acquire("d", Some(TTL), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    assert!(tokens.iter().all(|t| t.token < d.token));
    restarted.shutdown().await.unwrap();
}

/// A server that is gone: the client's next call says "not sent" (definite),
/// decided from the connection error's kind, not from its message text.
#[tokio::test]
async fn a_call_to_a_stopped_server_is_a_definite_connect_error() {
    let server = start_with_store(config(), Box::new(MemStore::default()))
        .await
        .unwrap();
    let mut client = Client::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    client.status("x").await.unwrap();
    server.shutdown().await.unwrap();
    let mut last = None;
    for _ in 0..50 {
        match client.status("x").await {
            Err(e @ ClientError::Connect { .. }) => {
                assert!(e.is_definite());
                return;
            }
            other => last = Some(other),
        }
    }
    panic!("never a Connect error: {last:?}");
}
