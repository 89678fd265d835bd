//! MQTT helpers of the end-to-end tests (`tests/tests/mqtt.rs`): the
//! external clients (Debian `mosquitto`, `mosquitto_pub`; PyPI `paho-mqtt`
//! in the venv `.ci/run` installs, found like moto through an environment
//! variable), a paho publisher script, an edge-only agent configuration with
//! `[mqtt]`, and a WAL reader that keeps the records' headers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use tributary_proto::Record;
use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, bin_path};

use crate::cluster::child_log_filter;

/// Names the Python interpreter that has `paho-mqtt` (default
/// `/tmp/tributary-py/bin/python`, where `.ci/run` installs it).
pub const PYTHON_ENV: &str = "TRIB_TEST_MQTT_PYTHON";

/// The pinned paho-mqtt of `.ci/run` and `scripts/test`.
pub const PAHO_VERSION: &str = "2.1.0";

/// A Debian tool (`mosquitto`, `mosquitto_pub`) from `PATH`.
///
/// # Panics
/// If it is missing: the test fails, saying how to install it.
pub fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    for dir in ["/usr/sbin", "/usr/bin", "/sbin"] {
        let candidate = Path::new(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "this test needs {name} (Debian packages mosquitto and mosquitto-clients): \
         apt-get install mosquitto mosquitto-clients (./.ci/run installs them)"
    );
}

/// The Python with paho-mqtt.
///
/// # Panics
/// If it is missing or cannot import paho: the test fails, saying how to
/// install it.
pub fn python() -> PathBuf {
    let python = std::env::var_os(PYTHON_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/tributary-py/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import paho.mqtt.client"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "this test needs paho-mqtt: python3 -m venv /tmp/tributary-py && \
         /tmp/tributary-py/bin/pip install 'paho-mqtt=={PAHO_VERSION}' (./.ci/run and \
         ./scripts/test install it), or set {PYTHON_ENV} to a python that has it; \
         {} cannot import it",
        python.display()
    );
    python
}

/// Python run before a paho script that corrects paho-mqtt 2.1's
/// reconnect reset (tested by `paho_resends_a_released_qos2_publish_unless_corrected`
/// in tests/tests/mqtt.rs).
pub const PAHO_PUBREL_FIX_PY: &str = r#"
import paho.mqtt.client as mqtt
# paho-mqtt 2.1 bug: a QoS 2 message whose PUBREL a reconnect put back
# in line (state resend_pubrel) becomes a PUBLISH again at the next
# reset, which every reconnect attempt does (a refused one too), though
# the PUBREL was sent (MQTT 3.1.1 and 5.0 section 4.3.3: the sender MUST
# NOT re-send the PUBLISH once it sent the PUBREL). A receiver that
# released the id takes the resend for a new message, as the spec says it
# must: stored twice (the agent's 20-SIGKILL test saw it once, q2-34). The
# tests check the agent, so their client keeps owing the PUBREL.
_reset_out = mqtt.Client._messages_reconnect_reset_out
def _reset_out_keeping_pubrel(self):
    with self._out_message_mutex:
        for m in self._out_messages.values():
            if m.qos == 2 and m.state == mqtt.mqtt_ms_resend_pubrel:
                m.state = mqtt.mqtt_ms_wait_for_pubcomp
    _reset_out(self)
mqtt.Client._messages_reconnect_reset_out = _reset_out_keeping_pubrel
"#;

/// The paho publisher: one JSON argument (host, port, client_id, protocol
/// 3|5, qos, count, topic, prefix, out, clean, user_props, content_type,
/// username, password, inflight, pace_s between publishes, deadline_s, pad:
/// {"i": bytes} pads message i with 'x' to that size). Publishes `count` messages
/// `{prefix}{i}`, riding out agent restarts (paho reconnects and resends
/// unacknowledged messages with DUP), and writes to `out` one line per
/// message: `acked {i}` or `refused {i} {reason code}`, then `done`.
pub const PUBLISHER_PY: &str = r#"
import json, sys, threading, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes


a = json.loads(sys.argv[1])
v5 = a["protocol"] == 5
kw = dict(client_id=a["client_id"], protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311)
if not v5:
    kw["clean_session"] = a.get("clean", False)
c = mqtt.Client(CallbackAPIVersion.VERSION2, **kw)
c.max_inflight_messages_set(a.get("inflight", 20))
c.reconnect_delay_set(0.05, 0.2)
if a.get("username") is not None:
    c.username_pw_set(a["username"], a.get("password"))
lock = threading.Lock()
mids, outcome = {}, {}
connected = threading.Event()

def on_connect(client, userdata, flags, reason_code, properties):
    if not reason_code.is_failure:
        connected.set()

def on_publish(client, userdata, mid, reason_code, properties):
    # Called from paho's network thread with paho's own locks held: only
    # record the outcome (never call into paho while holding `lock`).
    rc = reason_code.value if hasattr(reason_code, "value") else int(reason_code)
    with lock:
        if mid not in outcome:
            outcome[mid] = rc

c.on_connect = on_connect
c.on_publish = on_publish
if v5:
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = 0 if a.get("clean", False) else 3600
    c.connect_async(a["host"], a["port"], keepalive=30, clean_start=a.get("clean", False), properties=p)
else:
    c.connect_async(a["host"], a["port"], keepalive=30)
c.loop_start()
if not connected.wait(30):
    print("not connected within 30 s", file=sys.stderr)
    sys.exit(2)
for i in range(a["count"]):
    props = None
    if v5 and (a.get("user_props") or a.get("content_type")):
        props = Properties(PacketTypes.PUBLISH)
        for k, v in (a.get("user_props") or {}).items():
            props.UserProperty = (k, v)
        if a.get("content_type"):
            props.ContentType = a["content_type"]
    payload = f'{a["prefix"]}{i}'.encode()
    pad = (a.get("pad") or {}).get(str(i), 0)
    payload += b"x" * max(0, pad - len(payload))
    info = c.publish(a["topic"], payload, qos=a["qos"], properties=props)
    mids[info.mid] = i
    if a["qos"] == 0:
        info.wait_for_publish(10)
    if a.get("pace_s"):
        time.sleep(a["pace_s"])

def settled():
    with lock:
        return a["qos"] == 0 or sum(1 for m in mids if m in outcome) == a["count"]

deadline = time.time() + a.get("deadline_s", 120)
while time.time() < deadline and not settled():
    time.sleep(0.02)
if not settled():
    # For a failure message: where paho left what it never settled.
    with c._out_message_mutex:
        stuck = [(mids.get(m.mid), m.mid, str(m.state), m.dup) for m in c._out_messages.values()]
    print(f"{a['client_id']}: {len(stuck)} unsettled, first: {stuck[:10]}", file=sys.stderr)
time.sleep(0.2)
c.disconnect()
c.loop_stop()
lines, n = [], 0
with lock:
    for mid, i in sorted(mids.items(), key=lambda kv: kv[1]):
        rc = outcome.get(mid, 0 if a["qos"] == 0 else None)
        if rc is None:
            continue
        n += 1
        lines.append(f"refused {i} {rc}" if rc >= 0x80 else f"acked {i}")
with open(a["out"], "w") as f:
    f.write("\n".join(lines + ["done"]) + "\n")
sys.exit(0 if n == a["count"] else 1)
"#;

/// An edge agent without brokers (records stay in its WAL) with `[mqtt]`
/// on a free port: `mqtt_extra` is appended to the `[mqtt]` table (more
/// fields, `[[mqtt.topics]]` rules, `[mqtt.bridge]`).
pub struct MqttEdge {
    /// The process.
    pub edge: Proc,
    /// Local HTTP API.
    pub api: SocketAddr,
    /// MQTT listener.
    pub mqtt: SocketAddr,
    /// Data directory.
    pub data: PathBuf,
}

impl MqttEdge {
    /// Writes `dir/edge.toml` (topic `/plant1/readings`, intent `intent`);
    /// starts nothing.
    pub fn new(dir: &Path, intent: &str, mqtt_extra: &str) -> MqttEdge {
        let api = free_tcp();
        let mqtt = free_tcp();
        let data = dir.join("edge");
        let config = dir.join("edge.toml");
        std::fs::write(
            &config,
            format!(
                r#"data_dir = "{data}"
edge_id = "plant1"
local_api = "{api}"
checkpoint_interval_ms = 200

[[topics]]
name = "/plant1/readings"
intent = "{intent}"

[mqtt]
listen = "{mqtt}"
{mqtt_extra}
"#,
                data = data.display(),
            ),
        )
        .expect("edge config");
        let mut cmd = Command::new(bin_path("edge-agent"));
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", child_log_filter());
        MqttEdge {
            edge: Proc::new("edge-agent", cmd),
            api,
            mqtt,
            data,
        }
    }

    /// As [`MqttEdge::new`], the agent's stdout and stderr appended to
    /// `log` (at `info` and above, so its log lines can be checked).
    pub fn logged(dir: &Path, intent: &str, mqtt_extra: &str, log: &Path) -> MqttEdge {
        let mut edge = MqttEdge::new(dir, intent, mqtt_extra);
        let mut cmd = Command::new(bin_path("edge-agent"));
        cmd.arg("run")
            .arg("--config")
            .arg(dir.join("edge.toml"))
            .env("RUST_LOG", "info");
        edge.edge = Proc::logged("edge-agent", cmd, log).expect("edge log file");
        edge
    }

    /// Starts the agent and waits (10 s at most) for its MQTT port.
    pub fn start(&mut self) {
        self.edge.start();
        tributary_test_support::process::wait_for_tcp(
            "edge MQTT listener",
            self.mqtt,
            std::time::Duration::from_secs(10),
        );
    }

    /// WAL directory of `/plant1/{topic}`.
    pub fn wal_dir(&self, topic: &str) -> PathBuf {
        self.data.join("topics/plant1").join(topic)
    }
}

pub use crate::cluster::read_records;

/// The value of header `name` of `record`, as UTF-8.
pub fn header<'a>(record: &'a Record, name: &str) -> Option<&'a str> {
    record
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// Runs the paho publisher with `args` (JSON) and returns its exit status
/// and the lines it wrote.
pub fn run_publisher(args: &serde_json::Value, out: &Path) -> (bool, Vec<String>) {
    let mut args = args.clone();
    args["out"] = serde_json::json!(out.display().to_string());
    let status = Command::new(python())
        .arg("-c")
        .arg(format!("{PAHO_PUBREL_FIX_PY}{PUBLISHER_PY}"))
        .arg(args.to_string())
        .status()
        .expect("run python");
    let text = std::fs::read_to_string(out).unwrap_or_default();
    (status.success(), text.lines().map(str::to_owned).collect())
}
