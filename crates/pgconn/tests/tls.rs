//! TLS to a real PostgreSQL: a private cluster with `ssl = on` and a
//! certificate from a test CA (for 127.0.0.1 only), and one without TLS.
//! `verify-full` with the right CA connects (and the session is
//! encrypted); another CA, or a host name the certificate does not hold,
//! is refused naming the cause; `verify-ca` accepts the other name;
//! `require` against a server without TLS is refused; `prefer` falls back.

use baton_testkit::pg_cluster::PgCluster;
use baton_testkit::pki::Ca;
use baton_testkit::TempDir;

fn conninfo(host: &str, port: u16, extra: &str) -> String {
    format!("host={host} port={port} user=postgres dbname=postgres connect_timeout=10 {extra}")
}

async fn encrypted(conninfo: &str) -> Result<bool, String> {
    let client = baton_pgconn::connect(conninfo)
        .await
        .map_err(|e| e.to_string())?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_with_the_right_ca_and_refuses_the_wrong_one_or_name() {
    let dir = TempDir::new("pgtls-certs");
    let ca = Ca::new(dir.path(), "pg-ca");
    let other = Ca::new(dir.path(), "other-ca");
    let server = ca.server_for("pg-server", &["127.0.0.1"]);
    let tls = PgCluster::start("pgtls");
    tls.enable_tls(&server.cert, &server.key);
    let port = tls.port();
    let ca_pem = ca.cert.display().to_string();

    let full = format!("sslmode=verify-full sslrootcert={ca_pem}");
    assert_eq!(
        encrypted(&conninfo("127.0.0.1", port, &full)).await,
        Ok(true)
    );
    // The same as a URL, and through the environment's settings.
    let url = format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={ca_pem}"
    );
    assert_eq!(encrypted(&url).await, Ok(true));

    let wrong_ca = format!("sslmode=verify-full sslrootcert={}", other.cert.display());
    let e = encrypted(&conninfo("127.0.0.1", port, &wrong_ca))
        .await
        .unwrap_err();
    assert!(
        e.contains("UnknownIssuer") || e.contains("unknown issuer"),
        "names the cause: {e}"
    );

    // `localhost` is not in the certificate: verify-full refuses it,
    // verify-ca (chain only) accepts it.
    let e = encrypted(&conninfo("localhost", port, &full))
        .await
        .unwrap_err();
    assert!(
        e.contains("NotValidForName") || e.contains("not valid for name"),
        "names the cause: {e}"
    );
    let ca_only = format!("sslmode=verify-ca sslrootcert={ca_pem}");
    assert_eq!(
        encrypted(&conninfo("localhost", port, &ca_only)).await,
        Ok(true)
    );
    // require without a root: encrypted, not verified (as libpq).
    assert_eq!(
        encrypted(&conninfo("localhost", port, "sslmode=require")).await,
        Ok(true)
    );
    assert_eq!(
        encrypted(&conninfo("127.0.0.1", port, "sslmode=prefer")).await,
        Ok(true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_is_refused_and_prefer_falls_back() {
    let plain = PgCluster::start("pgplain");
    let port = plain.port();
    let e = encrypted(&conninfo("127.0.0.1", port, "sslmode=require"))
        .await
        .unwrap_err();
    assert!(
        e.to_lowercase().contains("tls") || e.contains("ssl"),
        "names the cause: {e}"
    );
    assert_eq!(
        encrypted(&conninfo("127.0.0.1", port, "sslmode=prefer")).await,
        Ok(false)
    );
    assert_eq!(
        encrypted(&conninfo("127.0.0.1", port, "sslmode=disable")).await,
        Ok(false)
    );
}
