//! The service's external effects under the storm ([`Service::effects`]):
//! the dispatchers the run starts, kills (SIGKILL) and pauses (SIGSTOP) on
//! a seeded tick beside the schedule, and the drain at the end.
//!
//! [`Service::effects`]: crate::Service::effects

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use baton_client::rng::Rng;
use baton_faults::signal::Signal;
use tokio::process::Child;
use tokio::time::Instant;

use crate::service::{DeliveryFigures, Effects};

/// How often the dispatchers' faults are drawn.
const TICK: Duration = Duration::from_millis(500);

struct Slot {
    child: Option<Child>,
    incarnation: u32,
    resume_at: Option<Instant>,
}

pub struct Dispatchers {
    effects: Box<dyn Effects>,
    slots: Vec<Slot>,
    server_url: String,
    ttl: Duration,
    logs: PathBuf,
    next_tick: Instant,
}

fn send(child: &Child, sig: Signal) {
    if let Some(pid) = child.id() {
        let _ = baton_faults::signal::send(pid, sig);
    }
}

impl Dispatchers {
    pub fn start(
        effects: Box<dyn Effects>,
        n: usize,
        server_url: String,
        ttl: Duration,
        logs: PathBuf,
    ) -> anyhow::Result<Self> {
        let mut d = Self {
            effects,
            slots: (0..n)
                .map(|_| Slot {
                    child: None,
                    incarnation: 0,
                    resume_at: None,
                })
                .collect(),
            server_url,
            ttl,
            logs,
            next_tick: Instant::now() + TICK,
        };
        for i in 0..n {
            d.spawn(i)?;
        }
        Ok(d)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        slot.resume_at = None;
        let name = format!("d{i}.{}", slot.incarnation);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("d{i}.log")))?;
        let child = self
            .effects
            .dispatcher_command(&name, &self.server_url, self.ttl)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start a dispatcher: {e}"))?;
        slot.child = Some(child);
        Ok(())
    }

    /// Resumes the dispatchers whose pause is over; on each tick, kills
    /// and restarts one, or pauses one for 0.5 to 3 TTLs, by the run's rng.
    pub async fn tick(
        &mut self,
        now: Instant,
        rng: &mut Rng,
        fired: &mut BTreeMap<&'static str, u64>,
    ) -> anyhow::Result<()> {
        for slot in &mut self.slots {
            if slot.resume_at.is_some_and(|at| at <= now) {
                slot.resume_at = None;
                if let Some(c) = &slot.child {
                    send(c, Signal::SIGCONT);
                }
            }
        }
        if self.slots.is_empty() || now < self.next_tick {
            return Ok(());
        }
        self.next_tick = now + TICK;
        let i = rng.below(self.slots.len() as u64) as usize;
        match rng.below(8) {
            0 => {
                if let Some(mut c) = self.slots[i].child.take() {
                    let _ = c.kill().await;
                }
                self.spawn(i)?;
                *fired.entry("kill_dispatcher").or_default() += 1;
            }
            1 if self.slots[i].resume_at.is_none() => {
                if let Some(c) = &self.slots[i].child {
                    send(c, Signal::SIGSTOP);
                    let ttl_ms = self.ttl.as_millis() as u64;
                    let ms = rng.between(ttl_ms / 2, 3 * ttl_ms);
                    self.slots[i].resume_at = Some(now + Duration::from_millis(ms));
                    *fired.entry("pause_dispatcher").or_default() += 1;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// When the storm loop must next wake up for a dispatcher, at the latest `at`.
    pub fn next_wake(&self, at: Instant) -> Instant {
        self.slots
            .iter()
            .filter_map(|s| s.resume_at)
            .fold(at.min(self.next_tick), Instant::min)
    }

    /// No more faults: every dispatcher runs; then waits (at most `bound`)
    /// until no delivery is left to settle, and counts.
    pub async fn drain(&mut self, bound: Duration) -> anyhow::Result<DeliveryFigures> {
        self.resume_all();
        let end = Instant::now() + bound;
        loop {
            let unsettled = self.effects.unsettled().await?;
            if unsettled == 0 || Instant::now() >= end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.effects.figures().await
    }

    /// No more pauses: every stopped dispatcher continues.
    pub fn resume_all(&mut self) {
        for slot in &mut self.slots {
            slot.resume_at = None;
            if let Some(c) = &slot.child {
                send(c, Signal::SIGCONT);
            }
        }
    }

    pub async fn kill_all(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut c) = slot.child.take() {
                let _ = c.kill().await;
            }
        }
    }
}
