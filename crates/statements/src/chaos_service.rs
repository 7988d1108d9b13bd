//! The statement service as `baton-chaos` sees it: its database through the
//! `ServiceDb` seam, its worker and Baton server as processes of this binary.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use baton_chaos::{Opening, Service, ServiceDb, WorkerSpec};
use baton_faults::checker::Accepted;
use tokio::process::Command;

use crate::store::{self, Db, JobState, Location};

/// This binary, storming itself.
pub struct StatementsService {
    exe: PathBuf,
    /// `s3://BUCKET/PREFIX` for the workers' objects; `None`: a directory
    /// of the run.
    objects: Option<String>,
}

impl StatementsService {
    pub fn new(objects: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            exe: std::env::current_exe()?,
            objects,
        })
    }
}

impl Service for StatementsService {
    fn open<'a>(&'a self, dir: &'a Path, database_url: Option<&'a str>) -> Opening<'a> {
        Box::pin(async move {
            let location = Location {
                db: dir.join("statements.sqlite"),
                database_url: database_url.map(str::to_string),
            };
            let db: Box<dyn ServiceDb> = Box::new(StatementsDb(store::open(&location).await?));
            Ok(db)
        })
    }

    fn worker_command(&self, spec: &WorkerSpec) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("worker")
            .arg("--db")
            .arg(spec.dir.join("statements.sqlite"))
            .arg("--objects")
            .arg(
                self.objects
                    .clone()
                    .unwrap_or_else(|| spec.dir.join("objects").display().to_string()),
            )
            .arg("--history")
            .arg(&spec.history)
            .args(["--server", &spec.server_url])
            .args(["--name", &spec.name])
            .args(["--ttl", &format!("{}ms", spec.ttl.as_millis())])
            .args(["--poll", "50ms"])
            .args(["--accounts", &spec.accounts])
            .args(["--pause-chance-pct", &spec.pause_chance_pct.to_string()])
            .args(["--chaos-seed", &spec.chaos_seed.to_string()]);
        if let Some(url) = &spec.database_url {
            cmd.args(["--database-url", url]);
        }
        if spec.unfenced {
            cmd.arg("--unfenced");
        }
        cmd.args(&spec.extra_args);
        cmd
    }

    fn server_command(&self, data_dir: &Path, listen: SocketAddr) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("serve-baton")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg(listen.to_string());
        cmd
    }

    fn is_open_state(&self, label: &str) -> bool {
        JobState::parse(label).is_ok_and(JobState::is_open)
    }

    fn effects<'a>(
        &'a self,
        spec: &'a baton_chaos::EffectsSpec,
    ) -> baton_chaos::EffectsOpening<'a> {
        Box::pin(async move {
            let Some(url) = &spec.database_url else {
                // The webhook receiver keeps its keys in PostgreSQL.
                return Ok(None);
            };
            let effects: Box<dyn baton_chaos::Effects> = Box::new(
                crate::chaos_effects::StatementsEffects::start(&self.exe, spec, url).await?,
            );
            Ok(Some(effects))
        })
    }
}

/// The service's store behind the chaos run's seam.
pub struct StatementsDb(pub Db);

#[async_trait::async_trait(?Send)]
impl ServiceDb for StatementsDb {
    async fn seed_job(&self, account: &str, date: &str, balance_cents: i64) -> anyhow::Result<()> {
        self.0.seed(account, date, balance_cents).await.map(|_| ())
    }

    async fn open_jobs(&self, prefix: &str) -> anyhow::Result<usize> {
        Ok(self.0.open_jobs(prefix).await?.len())
    }

    async fn job_states(&self, prefix: &str) -> anyhow::Result<Vec<(String, i64)>> {
        self.0.job_states(prefix).await
    }

    async fn publication_log(&self, prefix: &str) -> anyhow::Result<Vec<Accepted>> {
        Ok(self
            .0
            .publication_log(prefix)
            .await?
            .into_iter()
            .map(|p| Accepted {
                resource: p.resource,
                operation: p.operation,
                token: p.token,
            })
            .collect())
    }

    async fn pointers(&self, prefix: &str) -> anyhow::Result<Vec<(String, i64)>> {
        self.0.pointers(prefix).await
    }
}
