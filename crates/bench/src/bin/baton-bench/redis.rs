//! A minimal RESP2 client, enough for the Redis lock recipe: `SET key id NX
//! PX ttl`, `INCR` for a fencing token, and a compare-and-delete script.

use anyhow::Context;
use std::time::Duration;

use baton_bench::{Conn, Target};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const RELEASE_SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

#[derive(Debug)]
pub enum Value {
    Ok(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Value>),
}

pub struct Resp {
    stream: BufReader<TcpStream>,
}

impl Resp {
    pub async fn connect(addr: &str) -> anyhow::Result<Self> {
        let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow::anyhow!("connect to {addr} timed out"))?
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
        })
    }

    pub async fn cmd(&mut self, args: &[&[u8]]) -> anyhow::Result<Value> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&out).await?;
        self.read().await
    }

    async fn read(&mut self) -> anyhow::Result<Value> {
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let line = line.trim_end();
        let (kind, rest) = line.split_at(1.min(line.len()));
        match kind {
            "+" => Ok(Value::Ok(rest.to_string())),
            "-" => Err(anyhow::anyhow!("redis error: {rest}")),
            ":" => Ok(Value::Int(rest.parse().context("an integer reply")?)),
            "$" => {
                let n: i64 = rest.parse().context("a bulk length")?;
                if n < 0 {
                    return Ok(Value::Bulk(None));
                }
                let mut buf = vec![0u8; n as usize + 2];
                self.stream.read_exact(&mut buf).await?;
                buf.truncate(n as usize);
                Ok(Value::Bulk(Some(buf)))
            }
            "*" => {
                let n: i64 = rest.parse().context("an array length")?;
                let mut items = Vec::new();
                for _ in 0..n.max(0) {
                    items.push(Box::pin(self.read()).await?);
                }
                Ok(Value::Array(items))
            }
            _ => Err(anyhow::anyhow!("unexpected reply {line:?}")),
        }
    }
}

pub async fn aof_settings(addr: &str) -> anyhow::Result<(String, String)> {
    let mut c = Resp::connect(addr).await?;
    let get = |v: Value| match v {
        Value::Array(mut items) if items.len() == 2 => match items.pop() {
            Some(Value::Bulk(Some(b))) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => Err(anyhow::anyhow!("unexpected {other:?}")),
        },
        other => Err(anyhow::anyhow!("unexpected {other:?}")),
    };
    let appendonly = get(c.cmd(&[b"CONFIG", b"GET", b"appendonly"]).await?)?;
    let fsync = get(c.cmd(&[b"CONFIG", b"GET", b"appendfsync"]).await?)?;
    Ok((appendonly, fsync))
}

pub async fn set_aof(addr: &str, fsync: &str) -> anyhow::Result<()> {
    let mut c = Resp::connect(addr).await?;
    c.cmd(&[b"CONFIG", b"SET", b"appendonly", b"yes"]).await?;
    c.cmd(&[b"CONFIG", b"SET", b"appendfsync", fsync.as_bytes()])
        .await?;
    Ok(())
}

pub async fn restore_aof(addr: &str, appendonly: &str, fsync: &str) -> anyhow::Result<()> {
    let mut c = Resp::connect(addr).await?;
    c.cmd(&[b"CONFIG", b"SET", b"appendfsync", fsync.as_bytes()])
        .await?;
    c.cmd(&[b"CONFIG", b"SET", b"appendonly", appendonly.as_bytes()])
        .await?;
    Ok(())
}

pub struct Redis {
    addr: String,
    label: String,
    ttl_ms: String,
}

impl Redis {
    pub async fn probe(addr: &str) -> anyhow::Result<()> {
        Resp::connect(addr).await?.cmd(&[b"PING"]).await.map(|_| ())
    }

    pub fn new(addr: &str, label: &str, ttl_s: u64) -> Self {
        Self {
            addr: addr.to_string(),
            label: label.to_string(),
            ttl_ms: (ttl_s * 1000).to_string(),
        }
    }
}

impl Target for Redis {
    type Conn = RedisConn;

    fn server_processes(&self) -> &'static [&'static str] {
        &["redis-server"]
    }

    fn name(&self) -> String {
        self.label.clone()
    }

    async fn connect(&self) -> anyhow::Result<RedisConn> {
        let resp = Resp::connect(&self.addr).await?;
        Ok(RedisConn {
            resp,
            ttl_ms: self.ttl_ms.clone(),
            seq: 0,
            id: std::process::id() as u64,
        })
    }
}

pub struct RedisConn {
    resp: Resp,
    ttl_ms: String,
    seq: u64,
    id: u64,
}

impl Conn for RedisConn {
    type Held = (String, String);

    async fn acquire(&mut self, resource: &str, wait: bool) -> anyhow::Result<Self::Held> {
        self.seq += 1;
        let owner = format!("{}-{:p}-{}", self.id, &self.seq, self.seq);
        loop {
            let set = self
                .resp
                .cmd(&[
                    b"SET",
                    resource.as_bytes(),
                    owner.as_bytes(),
                    b"NX",
                    b"PX",
                    self.ttl_ms.as_bytes(),
                ])
                .await?;
            if matches!(&set, Value::Ok(s) if s == "OK") {
                let token_key = format!("{resource}:token");
                self.resp.cmd(&[b"INCR", token_key.as_bytes()]).await?;
                return Ok((resource.to_string(), owner));
            }
            if !wait {
                return Err(anyhow::anyhow!("held"));
            }
            // Redis has no server-side wait for SET NX: clients poll.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn release(&mut self, (resource, owner): Self::Held) -> anyhow::Result<()> {
        match self
            .resp
            .cmd(&[
                b"EVAL",
                RELEASE_SCRIPT.as_bytes(),
                b"1",
                resource.as_bytes(),
                owner.as_bytes(),
            ])
            .await?
        {
            Value::Int(1) => Ok(()),
            other => Err(anyhow::anyhow!("release: {other:?}")),
        }
    }
}
