//! `tribctl topics …`: create, describe, list, delete, peek, move and
//! unload topics; the subscription commands of the group (failure policies, seek,
//! dead-letter replay) are in [`super::subscriptions`].

use clap::Subcommand;
use serde::Deserialize;
use serde_json::json;
use tributary_api::admin::{
    CreateOutcome, DeleteOutcome, PlanAction, TopicDescription, TopicListEntry,
};
use tributary_api::client::Method;
use tributary_api::cluster::{MoveRequest, MoveResponse};
use tributary_api::consumer::ReceiveResponse;
use tributary_proto::keys::{NamespaceName, TopicName};

use super::subscriptions::{self, SetFailurePolicyArgs};
use super::{CommandError, Context, decode, partitions_text, topic_path};
use crate::client::AdminClient;

/// `tribctl topics …`.
#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Create a topic from a stream intent (aliases accepted).
    Create {
        /// Topic name, `/{namespace}/{topic}`.
        topic: String,
        /// Stream intent: realtime, event_stream, task_queue, audit_log or
        /// an alias.
        #[arg(long)]
        intent: String,
        /// Partitions (0 = non-partitioned; at most 256).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        partitions: i64,
    },
    /// Show delivery, the intent summary, partitions and subscriptions.
    Describe {
        /// Topic name.
        topic: String,
    },
    /// List topics (partitions of a partitioned topic are not listed).
    List {
        /// Only this namespace.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Delete a topic, its partitions and all their metadata.
    Delete {
        /// Topic name.
        topic: String,
    },
    /// Show a subscription's failure policy (stored, or what the first
    /// consumer will inherit).
    GetFailurePolicy {
        /// Topic name.
        topic: String,
        /// Subscription name.
        #[arg(short = 's', long = "subscription")]
        subscription: String,
    },
    /// Override a subscription's failure policy; unspecified flags keep
    /// their current values.
    SetFailurePolicy(SetFailurePolicyArgs),
    /// Show records of a topic without a subscription (values as text, or
    /// base64 when not UTF-8), from the log start or `--offset`.
    Peek {
        /// Topic name (e.g. a dead-letter topic `/default/jobs-dlq`).
        topic: String,
        /// First offset (default: the first stored).
        #[arg(long)]
        offset: Option<u64>,
        /// Most records shown (1 to 1000).
        #[arg(short = 'n', long, default_value_t = 10)]
        max_messages: u32,
    },
    /// Move a subscription's cursor to an offset or the first record at a
    /// timestamp; drops its leases and pending redeliveries and lifts a
    /// `block`.
    Seek {
        /// Topic name.
        topic: String,
        /// Subscription name.
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// New cursor (everything below it counts as acknowledged).
        #[arg(
            long,
            conflicts_with = "timestamp",
            required_unless_present = "timestamp"
        )]
        offset: Option<u64>,
        /// Instant, ms since the Unix epoch.
        #[arg(long)]
        timestamp: Option<i64>,
    },
    /// Move the messages a subscription dead-lettered back to the topic
    /// (appended as new records; each is replayed once).
    ReplayDlq {
        /// Topic name.
        topic: String,
        /// Subscription name.
        #[arg(short = 's', long = "subscription")]
        subscription: String,
    },
    /// Unload a topic from this broker: seal its active segment, wait until
    /// the tier service has committed every segment, then write the topic's
    /// `state` key (sealed, last committed offset, next offset, broker id)
    /// so another broker can continue its offsets. Stop the edge writing
    /// the topic first. Admin API `POST /v1/storage/topics/{ns}/{topic}/unload`
    /// (`docs/admin-api.md`).
    Unload {
        /// Topic name.
        topic: String,
        /// How long to wait for the tier service, ms.
        #[arg(long, default_value_t = 120_000)]
        wait_ms: u64,
    },
    /// Give a topic to another broker (a new ownership epoch): the owner
    /// stops serving it, edges are redirected on their next stream, the
    /// new owner continues at the archive's end and the edge re-sends the
    /// rest from its retained log. Admin API `POST
    /// /v1/topics/{ns}/{topic}/move`.
    Move {
        /// Topic name (each `-part-N` partition moves on its own).
        topic: String,
        /// The broker that is to own it (its node id, 1 or more).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        to: u64,
    },
    /// Give up on a damaged range of a topic that neither the edge nor the
    /// archive can supply again (see `topics describe`): record it in Raft
    /// as a hole (cause `damaged`), so consumers, tiering and the archive
    /// treat it as a declared hole from now on. Refused (409) unless the
    /// range is exactly one damaged range. Admin API `POST
    /// /v1/topics/{ns}/{topic}/skip-damaged`.
    SkipDamaged {
        /// Topic name.
        topic: String,
        /// The damaged range, `FIRST..END` (end exclusive), as `describe`
        /// shows it.
        #[arg(long, value_parser = parse_range)]
        range: (u64, u64),
        /// Why (kept with the hole).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// `A..B` with `A < B`.
fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?} is not FIRST..END"))?;
    let first: u64 = a
        .trim()
        .parse()
        .map_err(|e| format!("first offset {a:?}: {e}"))?;
    let end: u64 = b
        .trim()
        .parse()
        .map_err(|e| format!("end offset {b:?}: {e}"))?;
    if end <= first {
        return Err(format!("empty range {first}..{end}"));
    }
    Ok((first, end))
}

/// One damaged range in the topic view.
#[derive(Debug, Deserialize)]
struct DamagedRangeView {
    first_offset: u64,
    end_offset: u64,
    segment_base: u64,
    position: u64,
    bytes: u64,
    reason: String,
}

/// One hole in the topic view.
#[derive(Debug, Deserialize)]
struct HoleView {
    first_offset: u64,
    end_offset: u64,
    cause: String,
    reason: String,
}

/// The admin API's topic view: the catalog's description plus what this
/// broker's WAL and Raft know of damaged ranges and holes.
#[derive(Debug, Deserialize)]
struct TopicView {
    #[serde(flatten)]
    description: TopicDescription,
    /// Absent from an admin API without access to the broker's WALs.
    #[serde(default)]
    damaged_ranges: Option<Vec<DamagedRangeView>>,
    #[serde(default)]
    holes: Vec<HoleView>,
}

/// Runs `tribctl topics …`.
///
/// # Errors
/// [`CommandError`].
pub fn run(ctx: &Context<'_>, command: &TopicsCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        TopicsCommand::Create {
            topic,
            intent,
            partitions,
        } => {
            let body = json!({"name": topic, "intent": intent, "partitions": partitions});
            let value = client.send_json(Method::Post, "/v1/topics", &body)?;
            ctx.render(value, |o: CreateOutcome| {
                let verb = match o.action {
                    PlanAction::Create => "created",
                    PlanAction::Update => "updated",
                    PlanAction::Unchanged => "unchanged",
                };
                let namespace = if o.namespace_created {
                    format!("created namespace {}\n", o.topic.namespace())
                } else {
                    String::new()
                };
                format!(
                    "{namespace}{verb} topic {} ({}, {})\n",
                    o.topic,
                    o.intent,
                    partitions_text(o.partitions)
                )
            })
        }
        TopicsCommand::Describe { topic } => {
            let value = client.get(&topic_path(topic)?, &[])?;
            ctx.render(value, |v: TopicView| {
                let mut text = describe_text(&v.description);
                let known = v.damaged_ranges.is_some();
                let damaged = v.damaged_ranges.unwrap_or_default();
                if damaged.is_empty() && known {
                    text.push_str("Damaged ranges: none\n");
                }
                for d in &damaged {
                    text.push_str(&format!(
                        "Damaged range: {}..{} ({} bytes at byte {} of segment {}: {}); \
                         re-fetched from the edge or the archive, or skip it with \
                         `tribctl topics skip-damaged {} --range {}..{}`\n",
                        d.first_offset,
                        d.end_offset,
                        d.bytes,
                        d.position,
                        d.segment_base,
                        d.reason,
                        v.description.topic,
                        d.first_offset,
                        d.end_offset
                    ));
                }
                for h in &v.holes {
                    text.push_str(&format!(
                        "Hole: {}..{} (cause {}: {})\n",
                        h.first_offset, h.end_offset, h.cause, h.reason
                    ));
                }
                text
            })
        }
        TopicsCommand::List { namespace } => {
            let mut query = Vec::new();
            if let Some(ns) = namespace {
                query.push(("namespace", NamespaceName::new(ns)?.to_string()));
            }
            let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let value = client.get("/v1/topics", &query)?;
            #[derive(Deserialize)]
            struct Topics {
                topics: Vec<TopicListEntry>,
            }
            ctx.render(value, |list: Topics| {
                list.topics
                    .iter()
                    .map(|t| match t.partitions {
                        0 => format!("{}\n", t.name),
                        n => format!("{} ({})\n", t.name, partitions_text(n)),
                    })
                    .collect()
            })
        }
        TopicsCommand::SkipDamaged {
            topic,
            range: (first_offset, end_offset),
            reason,
        } => {
            let path = format!("{}/skip-damaged", topic_path(topic)?);
            let body = json!({
                "first_offset": first_offset,
                "end_offset": end_offset,
                "reason": reason,
            });
            let value = client.send_json(Method::Post, &path, &body)?;
            ctx.render(value, |v: serde_json::Value| {
                format!(
                    "skipped damaged range {first_offset}..{end_offset} of {topic}: recorded as a hole \
                     (cause {})\n",
                    v["hole"]["cause"].as_str().unwrap_or("damaged")
                )
            })
        }
        TopicsCommand::Move { topic, to } => {
            let path = format!("{}/move", topic_path(topic)?);
            let value = client.send_json(Method::Post, &path, &json!(MoveRequest { to: *to }))?;
            ctx.render(value, |m: MoveResponse| {
                let from = m
                    .from
                    .map_or_else(|| "no owner".to_owned(), |b| format!("broker {b}"));
                format!(
                    "moved {} from {from} to broker {} (epoch {})\n",
                    m.topic, m.to, m.epoch
                )
            })
        }
        TopicsCommand::Delete { topic } => {
            let value = client.delete(&topic_path(topic)?)?;
            ctx.render(value, |d: DeleteOutcome| {
                let note = d.note.map(|n| format!("note: {n}\n")).unwrap_or_default();
                format!(
                    "deleted topic {} ({}, {} metadata keys)\n{note}",
                    d.topic,
                    partitions_text(d.partitions),
                    d.deleted_keys
                )
            })
        }
        TopicsCommand::GetFailurePolicy {
            topic,
            subscription,
        } => subscriptions::get_failure_policy(ctx, &client, topic, subscription),
        TopicsCommand::SetFailurePolicy(args) => {
            subscriptions::set_failure_policy(ctx, &client, args)
        }
        TopicsCommand::Peek {
            topic,
            offset,
            max_messages,
        } => {
            let mut query = vec![("max_messages", max_messages.to_string())];
            if let Some(offset) = offset {
                query.push(("offset", offset.to_string()));
            }
            let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let path = format!("{}/records", topic_path(topic)?);
            let mut value = client.get(&path, &query)?;
            let stopped = stopped_before_damage(&client, &path, &value, *max_messages);
            // `--json` says it too, as `stopped_before_damage`.
            if let (Some(why), Some(object)) = (&stopped, value.as_object_mut()) {
                object.insert("stopped_before_damage".into(), why.clone().into());
            }
            ctx.render(value, |r: ReceiveResponse| {
                let mut text = peek_text(topic, &r);
                if let Some(why) = &stopped {
                    text.push_str(&format!("stopped before damage: {why}\n"));
                }
                text
            })
        }
        TopicsCommand::Seek {
            topic,
            subscription,
            offset,
            timestamp,
        } => subscriptions::seek(ctx, &client, topic, subscription, *offset, *timestamp),
        TopicsCommand::Unload { topic, wait_ms } => unload(ctx, &client, topic, *wait_ms),
        TopicsCommand::ReplayDlq {
            topic,
            subscription,
        } => subscriptions::replay_dlq(ctx, &client, topic, subscription),
    }
}

/// `tribctl topics unload`: calls the unload endpoint until the broker
/// answers `unloaded` (everything tiered, `state` written) or `wait_ms`
/// passes, polling every second while it answers `sealed`.
fn unload(
    ctx: &Context<'_>,
    client: &AdminClient,
    topic: &str,
    wait_ms: u64,
) -> Result<String, CommandError> {
    let name = TopicName::new(topic)?;
    let path = format!(
        "/v1/storage/topics/{}/{}/unload",
        name.namespace(),
        name.topic()
    );
    let started = std::time::Instant::now();
    #[derive(Deserialize)]
    struct Progress {
        outcome: String,
        #[serde(default)]
        sealed_offset: u64,
        #[serde(default)]
        tiered_offset: Option<u64>,
    }
    loop {
        let value = client.send_json(Method::Post, &path, &json!({}))?;
        let progress: Progress = decode(value.clone())?;
        if progress.outcome == "unloaded" {
            return ctx.render(value, |u: Unloaded| {
                format!(
                    "{topic} unloaded: next offset {}, last committed {}, state at {}\n",
                    u.state.next_offset,
                    u.state
                        .last_committed_offset
                        .map_or_else(|| "none".to_owned(), |o| o.to_string()),
                    u.key
                )
            });
        }
        let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if waited_ms >= wait_ms {
            return Err(CommandError::UnloadPending {
                topic: topic.to_owned(),
                sealed_offset: progress.sealed_offset,
                tiered_offset: progress.tiered_offset,
                waited_ms,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(
            1000.min(wait_ms - waited_ms),
        ));
    }
}

/// The answer of an unload that is complete.
#[derive(Deserialize)]
struct Unloaded {
    key: String,
    state: UnloadState,
}

#[derive(Deserialize)]
struct UnloadState {
    last_committed_offset: Option<u64>,
    next_offset: u64,
}

/// A peek returns the good records before a damaged range and stops there
/// without naming it (a read that starts in it is refused, naming it). When
/// `value` holds fewer than `max` records and stops below the high-water
/// mark, one more read from its cursor asks why: the broker's message
/// naming the damaged range, when that is the reason.
fn stopped_before_damage(
    client: &crate::client::AdminClient,
    path: &str,
    value: &serde_json::Value,
    max: u32,
) -> Option<String> {
    let r: ReceiveResponse = serde_json::from_value(value.clone()).ok()?;
    if r.messages.len() >= max as usize || r.cursor >= r.high_water_mark {
        return None;
    }
    let cursor = r.cursor.to_string();
    match client.get(path, &[("offset", cursor.as_str()), ("max_messages", "1")]) {
        Err(tributary_api::client::ClientError::Api { kind, message, .. })
            if kind == "damaged_range" =>
        {
            Some(message)
        }
        _ => None,
    }
}

fn peek_text(topic: &str, r: &ReceiveResponse) -> String {
    let mut out = format!(
        "{topic}: {} record(s), high-water mark {}\n",
        r.messages.len(),
        r.high_water_mark
    );
    for m in &r.messages {
        let value = match (&m.value, &m.value_b64) {
            (Some(text), _) => format!("{text:?}"),
            (None, Some(b64)) => format!("base64:{b64}"),
            _ => String::new(),
        };
        let key = m
            .key
            .as_deref()
            .map(|k| format!(" key={k:?}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "offset {} ts {}{key} value {value}\n",
            m.offset, m.timestamp_ms
        ));
        for h in &m.headers {
            let v = h
                .value
                .clone()
                .or_else(|| h.value_b64.as_ref().map(|b| format!("base64:{b}")))
                .unwrap_or_default();
            out.push_str(&format!("  {}: {v}\n", h.name));
        }
    }
    out
}

/// The seed's `describe` sample format (its `Broker ID` line is `Owner:
/// broker N (epoch E)`, or `unassigned`), then partitions and
/// subscriptions.
fn describe_text(d: &TopicDescription) -> String {
    let owner = match (d.broker_id, d.epoch) {
        (Some(id), Some(epoch)) => format!("broker {id} (epoch {epoch})"),
        (Some(id), None) => format!("broker {id}"),
        (None, _) => "unassigned".to_owned(),
    };
    let subscriptions = if d.subscriptions.is_empty() {
        "none".to_owned()
    } else {
        d.subscriptions
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // `create` says "non-partitioned" for 0: so does `describe`.
    let partitions = match d.partitions {
        0 => "0 (non-partitioned)".to_owned(),
        n => n.to_string(),
    };
    format!(
        "Topic: {}\nOwner: {owner}\nDelivery: {}\nIntent: {}\nPartitions: {partitions}\n\
         Subscriptions: {subscriptions}\n",
        d.topic, d.delivery, d.intent_summary
    )
}
