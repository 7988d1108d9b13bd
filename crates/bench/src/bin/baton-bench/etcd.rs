//! etcd's lock API: each client holds one lease (a session, as etcd's
//! concurrency package does) and cycles Lock(name, lease) → Unlock(key).
//! The lock key's revision is etcd's fencing token.

use anyhow::Context;
use baton_bench::{Conn, Target};
use tonic::transport::Channel;

pub mod etcdserverpb {
    #![allow(clippy::all)]
    tonic::include_proto!("etcdserverpb");
}
pub mod v3lockpb {
    #![allow(clippy::all)]
    tonic::include_proto!("v3lockpb");
}

use etcdserverpb::lease_client::LeaseClient;
use v3lockpb::lock_client::LockClient;

pub struct Etcd {
    url: String,
}

impl Etcd {
    pub async fn probe(url: &str) -> anyhow::Result<Self> {
        let channel = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            Channel::from_shared(url.to_string())?.connect(),
        )
        .await
        .map_err(|_| anyhow::anyhow!("connect to {url} timed out"))?
        .with_context(|| format!("connect to {url}"))?;
        LeaseClient::new(channel)
            .lease_grant(etcdserverpb::LeaseGrantRequest { ttl: 5, id: 0 })
            .await?;
        Ok(Self {
            url: url.to_string(),
        })
    }
}

impl Target for Etcd {
    type Conn = EtcdConn;

    fn server_processes(&self) -> &'static [&'static str] {
        &["etcd"]
    }

    fn name(&self) -> String {
        "etcd lock API".into()
    }

    async fn connect(&self) -> anyhow::Result<EtcdConn> {
        let channel = Channel::from_shared(self.url.clone())?.connect().await?;
        let lease = LeaseClient::new(channel.clone())
            .lease_grant(etcdserverpb::LeaseGrantRequest { ttl: 60, id: 0 })
            .await?
            .into_inner()
            .id;
        Ok(EtcdConn {
            lock: LockClient::new(channel),
            lease,
        })
    }
}

pub struct EtcdConn {
    lock: LockClient<Channel>,
    lease: i64,
}

impl Conn for EtcdConn {
    type Held = Vec<u8>;

    async fn acquire(&mut self, resource: &str, _wait: bool) -> anyhow::Result<Vec<u8>> {
        // etcd's Lock always waits in line on the server.
        let r = self
            .lock
            .lock(v3lockpb::LockRequest {
                name: resource.as_bytes().to_vec(),
                lease: self.lease,
            })
            .await;
        Ok(r?.into_inner().key)
    }

    async fn release(&mut self, key: Vec<u8>) -> anyhow::Result<()> {
        self.lock.unlock(v3lockpb::UnlockRequest { key }).await?;
        Ok(())
    }
}
