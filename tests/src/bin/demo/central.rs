//! The demo's central cluster: one broker or three (each with its tier
//! service), and the outage in the middle of the replay: a single broker
//! is stopped with SIGTERM; in a cluster the owner of the readings topic
//! is SIGKILLed with its tier service (a lost host), and the others take
//! over its topics.

use tributary_test_support::process::Proc;

use crate::READINGS;
use crate::processes::Layout;
use crate::summary::Summary;

/// The brokers and tier services, by node id − 1.
pub struct Central {
    pub brokers: Vec<Proc>,
    pub tiers: Vec<Proc>,
    /// The broker taken down, while it is down.
    down: Option<usize>,
}

impl Central {
    /// Logged processes for every broker and tier service of `layout`.
    pub fn new(layout: &Layout) -> anyhow::Result<Central> {
        let mut brokers = Vec::new();
        let mut tiers = Vec::new();
        for id in 1..=layout.brokers() {
            let (broker_log, tier_log): (&'static str, &'static str) = match id {
                1 if layout.brokers() == 1 => ("broker", "tier-service"),
                1 => ("broker-1", "tier-service-1"),
                2 => ("broker-2", "tier-service-2"),
                _ => ("broker-3", "tier-service-3"),
            };
            let mut cmd = std::process::Command::new(layout.bin("broker"));
            cmd.arg("--config").arg(layout.broker_config(id));
            brokers.push(layout.logged(broker_log, cmd)?);
            let mut cmd = std::process::Command::new(layout.bin("tier-service"));
            cmd.arg("--config").arg(layout.tier_config(id));
            tiers.push(layout.logged(tier_log, cmd)?);
        }
        Ok(Central {
            brokers,
            tiers,
            down: None,
        })
    }

    /// Whether a broker is down for the outage.
    pub fn is_down(&self) -> bool {
        self.down.is_some()
    }

    /// Takes one broker down: SIGTERM of the single broker (its exit code
    /// is recorded), or SIGKILL of the readings topic's owner and its tier
    /// service.
    pub fn outage(&mut self, layout: &Layout, summary: &mut Summary) -> anyhow::Result<()> {
        if self.brokers.len() == 1 {
            eprintln!("demo: stopping the broker (SIGTERM); the edge keeps accepting");
            let code = self.brokers[0].terminate();
            summary
                .exit_codes
                .push(("broker (mid-replay stop)".into(), code));
            self.down = Some(0);
            return Ok(());
        }
        // The owner marks the topic when the edge's stream first opens it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let owner = loop {
            if let Some(owner) = layout.owner(READINGS) {
                break owner;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no broker opened {READINGS} as owner within 60 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        eprintln!(
            "demo: SIGKILL of broker {owner}, the owner of {READINGS}, and its tier service; the others take over"
        );
        let i = (owner - 1) as usize;
        self.brokers[i].kill();
        self.tiers[i].kill();
        self.down = Some(i);
        Ok(())
    }

    /// Starts the broker taken down (and its tier service) again.
    pub fn restart(&mut self) {
        if let Some(i) = self.down.take() {
            self.brokers[i].start();
            if self.brokers.len() > 1 {
                self.tiers[i].start();
            }
        }
    }

    /// A broker or tier service that should be running (all but the one
    /// taken down) and exited on its own: its name and exit status.
    pub fn exited(&mut self) -> Option<String> {
        let n = self.brokers.len();
        for (what, procs) in [
            ("broker", &mut self.brokers),
            ("tier-service", &mut self.tiers),
        ] {
            for (i, proc) in procs.iter_mut().enumerate() {
                if Some(i) == self.down {
                    continue;
                }
                if let Some(status) = proc.exited() {
                    return Some(format!("{} {status}", name(what, i, n)));
                }
            }
        }
        None
    }

    /// Stops every tier service, then every broker, with SIGTERM; records
    /// each exit code (0 expected).
    pub fn stop_all(&mut self, summary: &mut Summary) {
        let n = self.brokers.len();
        for (i, tier) in self.tiers.iter_mut().enumerate() {
            stop(summary, &name("tier-service", i, n), tier);
        }
        for (i, broker) in self.brokers.iter_mut().enumerate() {
            stop(summary, &name("broker", i, n), broker);
        }
    }
}

fn name(what: &str, i: usize, n: usize) -> String {
    if n == 1 {
        what.to_owned()
    } else {
        format!("{what}-{}", i + 1)
    }
}

fn stop(summary: &mut Summary, name: &str, proc: &mut Proc) {
    if proc.is_running() {
        let code = proc.terminate();
        summary.exit_codes.push((name.to_string(), code));
    }
}
