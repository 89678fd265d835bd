//! The demo's processes and their APIs: the work directory and its
//! configuration files (certificates from `tribctl certs`, free ports), the
//! logged broker, tier service and edge agent, HTTP reads of their APIs and
//! `/metrics`, and graceful stops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::Value;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::Proc;

use crate::options::Args;
use crate::summary::Summary;
use crate::{DAILY, READINGS, TOKEN};

/// Marker file of a work directory this program made (and may empty).
const MARKER: &str = ".tributary-demo";

/// Ports and paths of one run.
pub struct Layout {
    pub work: PathBuf,
    pub bins: PathBuf,
    /// Broker 1's admin API.
    pub admin: SocketAddr,
    /// Every broker's admin API, by node id − 1.
    pub admins: Vec<SocketAddr>,
    pub edge_api: SocketAddr,
}

impl Layout {
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bins.join(name)
    }

    pub fn admin_url(&self) -> String {
        format!("https://{}", self.admin)
    }

    /// Brokers in the cluster.
    pub fn brokers(&self) -> u64 {
        self.admins.len() as u64
    }

    /// Broker `id`'s data directory: `broker` for a single broker,
    /// `broker-{id}` in a cluster.
    pub fn broker_data(&self, id: u64) -> PathBuf {
        if self.brokers() == 1 {
            self.work.join("broker")
        } else {
            self.work.join(format!("broker-{id}"))
        }
    }

    /// Broker `id`'s configuration file (`broker.toml` for a single one).
    pub fn broker_config(&self, id: u64) -> PathBuf {
        if self.brokers() == 1 {
            self.work.join("broker.toml")
        } else {
            self.work.join(format!("broker-{id}.toml"))
        }
    }

    /// Tier service `id`'s configuration file (`tier.toml` for a single one).
    pub fn tier_config(&self, id: u64) -> PathBuf {
        if self.brokers() == 1 {
            self.work.join("tier.toml")
        } else {
            self.work.join(format!("tier-{id}.toml"))
        }
    }

    /// The broker owning `topic` now: the highest epoch among the
    /// ownership markers (`{data}/ownership/{ns}/{topic}`) the brokers
    /// write when they open a topic as owner.
    pub fn owner(&self, topic: &str) -> Option<u64> {
        (1..=self.brokers())
            .filter_map(|id| {
                let path = self
                    .broker_data(id)
                    .join("ownership")
                    .join(topic.trim_start_matches('/'));
                let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
                Some((v["epoch"].as_u64()?, id))
            })
            .max()
            .map(|(_, id)| id)
    }

    /// The development CA the demo's certificates chain to.
    pub fn ca(&self) -> PathBuf {
        self.work.join("certs").join("ca.pem")
    }

    /// The file holding the tier service's named token (mode 0600),
    /// written once the broker is up ([`create_tier_principal`]).
    pub fn tier_token_file(&self) -> PathBuf {
        self.work.join("tier-token")
    }

    /// `command` as process `name`, both streams appended to
    /// `logs/{name}.log` under the work directory.
    pub fn logged(&self, name: &'static str, command: Command) -> anyhow::Result<Proc> {
        let path = self.work.join("logs").join(format!("{name}.log"));
        Proc::logged(name, command, &path).with_context(|| format!("opening {}", path.display()))
    }
}

pub fn prepare_work_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        let empty = std::fs::read_dir(dir)?.next().is_none();
        if !empty {
            ensure!(
                dir.join(MARKER).exists(),
                "{} is not empty and not a previous demo's work directory; give another --work-dir",
                dir.display()
            );
            std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::write(dir.join(MARKER), "work directory of tributary's demo\n")?;
    Ok(())
}

pub fn write_configs(layout: &Layout, args: &Args) -> anyhow::Result<()> {
    let work = &layout.work;
    let certs = work.join("certs");
    let mut certs_cmd = Command::new(layout.bin("tribctl"));
    certs_cmd.arg("certs");
    for id in 1..=layout.brokers() {
        certs_cmd.args(["--broker", &id.to_string()]);
    }
    let status = certs_cmd
        .args(["--edge", "plant1", "--out"])
        .arg(&certs)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running tribctl certs")?;
    ensure!(status.success(), "tribctl certs failed: {status}");
    let c = certs.display();
    let rafts: Vec<SocketAddr> = (0..layout.brokers()).map(|_| free_udp()).collect();
    let ingests: Vec<SocketAddr> = (0..layout.brokers()).map(|_| free_udp()).collect();
    // A cluster lists its Raft members; a single broker is its own.
    let members = if layout.brokers() == 1 {
        String::new()
    } else {
        let list: String = rafts
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("{} = \"{addr}\"\n", i + 1))
            .collect();
        format!("[members]\n{list}")
    };
    // The admin API over HTTPS with the demo CA; a broker's config holds
    // the bootstrap admin token: mode 0600. The tier services get a named
    // token of role `tier` once the brokers are up.
    for id in 1..=layout.brokers() {
        let i = (id - 1) as usize;
        write_private(
            &layout.broker_config(id),
            format!(
                r#"node_id = {id}
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
ingest_listen = "{ingest}"
admin_token = "{TOKEN}"
[tls]
cert = "{c}/broker-{id}.pem"
key = "{c}/broker-{id}.key"
ca = "{c}/ca.pem"
{members}
[wal]
segment_max_age_ms = {age}
[archive.store]
url = "{archive}"
"#,
                data = layout.broker_data(id).display(),
                raft = rafts[i],
                admin = layout.admins[i],
                ingest = ingests[i],
                age = args.segment_age_ms,
                archive = work.join("archive").display(),
            ),
        )?;
        std::fs::write(
            layout.tier_config(id),
            format!(
                r#"data_dir = "{data}"
poll_interval_ms = 1000
metrics_listen = "{metrics}"
[broker]
url = "https://{admin}"
ca = "{c}/ca.pem"
token_file = "{token_file}"
[store]
url = "{archive}"
"#,
                data = layout.broker_data(id).display(),
                admin = layout.admins[i],
                token_file = layout.tier_token_file().display(),
                archive = work.join("archive").display(),
                metrics = free_tcp(),
            ),
        )?;
    }
    let brokers: Vec<String> = ingests.iter().map(|a| format!("\"{a}\"")).collect();
    std::fs::write(
        work.join("edge.toml"),
        format!(
            r#"data_dir = "{data}"
edge_id = "plant1"
brokers = [{brokers}]
local_api = "{api}"
checkpoint_interval_ms = 200
[tls]
cert = "{c}/edge-plant1.pem"
key = "{c}/edge-plant1.key"
ca = "{c}/ca.pem"
[[topics]]
name = "{READINGS}"
intent = "event_stream"
[[topics]]
name = "{DAILY}"
intent = "audit_log"
"#,
            data = work.join("edge").display(),
            api = layout.edge_api,
            brokers = brokers.join(", "),
        ),
    )?;
    Ok(())
}

/// Creates the tier service's principal `tier-1` with role `tier` through
/// `tribctl auth create` (as the bootstrap admin) and writes its token,
/// shown once, to [`Layout::tier_token_file`] with mode 0600.
pub fn create_tier_principal(layout: &Layout) -> anyhow::Result<()> {
    let output = Command::new(layout.bin("tribctl"))
        .arg("--admin-url")
        .arg(layout.admin_url())
        .arg("--ca")
        .arg(layout.ca())
        .env("TRIB_ADMIN_TOKEN", TOKEN)
        .args(["--output", "json"])
        .args(["auth", "create", "tier-1", "--role", "tier"])
        .output()
        .context("running tribctl auth create")?;
    ensure!(
        output.status.success(),
        "tribctl auth create tier-1 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let created: Value = serde_json::from_slice(&output.stdout)
        .context("tribctl auth create --output json: not JSON")?;
    let token = created["token"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("tribctl auth create printed no token"))?;
    write_private(&layout.tier_token_file(), format!("{token}\n"))?;
    Ok(())
}

/// An agent for the broker's HTTPS admin API (trusting only the demo CA)
/// and the edge's plain local API.
pub fn http(layout: &Layout) -> ureq::Agent {
    tributary_test_support::certs::https_agent_with_timeout(
        &[layout.work.join("certs")],
        Duration::from_secs(120),
    )
}

pub fn get_json(agent: &ureq::Agent, url: &str, token: Option<&str>) -> Option<Value> {
    let mut request = agent.get(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let mut response = request.call().ok()?;
    if response.status() != 200 {
        return None;
    }
    response.body_mut().read_json().ok()
}

pub fn get_text(agent: &ureq::Agent, url: &str) -> Option<String> {
    let mut response = agent.get(url).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    response.body_mut().read_to_string().ok()
}

pub fn wait_until(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !ready() {
        ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// (high-water mark, acknowledged offset, bytes in) of an edge topic.
pub fn edge_topic(agent: &ureq::Agent, layout: &Layout, topic: &str) -> Option<(u64, u64, u64)> {
    let url = format!("http://{}/v1/topics{topic}", layout.edge_api);
    let state = get_json(agent, &url, None)?;
    Some((
        state["high_water_mark"].as_u64()?,
        state["acknowledged_offset"].as_u64()?,
        state["bytes_in"].as_u64()?,
    ))
}

/// A sample of an OpenMetrics exposition by name (and the labels given).
pub fn metric(text: &str, name: &str) -> Option<u64> {
    // Edge series carry an `edge` label: matched by name and the labels
    // given.
    tributary_tests::cluster::metric_value(text, name)
}

/// The committed tiered offset of `topic` (admin API).
pub fn tiered_offset(agent: &ureq::Agent, layout: &Layout, topic: &str) -> Option<u64> {
    let url = format!("{}/v1/storage/topics", layout.admin_url());
    let doc = get_json(agent, &url, Some(TOKEN))?;
    doc["topics"]
        .as_array()?
        .iter()
        .find(|t| t["topic"] == topic)?["tiered_offset"]
        .as_u64()
}

pub fn stop(summary: &mut Summary, name: &str, proc: &mut Proc) {
    if proc.is_running() {
        let code = proc.terminate();
        summary.exit_codes.push((name.to_string(), code));
    }
}

/// Writes `text` to `path` with mode 0600: the broker and the tier service
/// refuse a world-readable configuration file that holds a token.
fn write_private(path: &std::path::Path, text: String) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}
