//! Jobs keep coming from a thread of their own with its own connection:
//! with SQLite, a worker stopped inside a write transaction blocks every
//! writer until it is resumed, and resuming is the orchestrator loop's job.

use std::time::Duration;

use std::path::PathBuf;
use std::sync::Arc;

use crate::service::{Service, ServiceDb};

/// The statement date of every chaos job.
pub const DATE: &str = "2026-12-01";

/// Keeps `target` jobs open, seeding new accounts every 100 ms while fewer
/// are open, until stopped.
pub struct Seeder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<u64>>,
}

impl Seeder {
    pub fn start(
        service: Arc<dyn Service>,
        dir: PathBuf,
        database_url: Option<String>,
        prefix: String,
        open_target: usize,
    ) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let db = service.open(&dir, database_url.as_deref()).await?;
                let mut seeded = 0u64;
                while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                    seeded += seed_jobs(&*db, &prefix, open_target, seeded).await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(seeded)
            })
        });
        Self { stop, thread }
    }

    /// Stops seeding; returns how many jobs were seeded.
    pub fn stop(self) -> anyhow::Result<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the seeding thread panicked"))?
    }
}

async fn seed_jobs(
    db: &dyn ServiceDb,
    prefix: &str,
    target: usize,
    seeded: u64,
) -> anyhow::Result<u64> {
    let open = db
        .open_jobs(prefix)
        .await
        .map_err(|e| anyhow::anyhow!("counting open jobs: {e}"))?;
    let mut added = 0;
    for n in open..target {
        let account = format!("{prefix}{:06}", seeded + added);
        db.seed_job(&account, DATE, 1_000 + n as i64)
            .await
            .map_err(|e| anyhow::anyhow!("seeding {account}: {e}"))?;
        added += 1;
    }
    Ok(added)
}
