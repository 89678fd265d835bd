//! `tribctl topics | namespaces | apply | cluster`: admin commands over the
//! broker's admin HTTP API. Each command returns the text to print; with
//! `--output json` that is the API's JSON response, pretty-printed.
//!
//! Text formats (stable, tested in `ctl/tests/`):
//! - `topics describe` follows the seed's sample output
//!   (`seeds/000_d502aacc865e81b1.txt`): `Topic`, `Broker ID`, `Delivery`,
//!   `Intent` lines, then `Partitions` and `Subscriptions`.
//! - `apply` prints one line per plan item, `{action:<9} {kind} {name}
//!   ({intent}, {partitions})`, then a summary line.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tributary_api::admin::{
    ApplyReport, CreateOutcome, DeleteOutcome, FailurePolicyView, ItemKind, PlanAction, PlanItem,
    PolicySource, TopicDescription, TopicListEntry,
};
use tributary_api::consumer::{ReceiveResponse, ReplayResponse, SeekRequest};
use tributary_proto::keys::{NameError, NamespaceName, SubscriptionName, TopicName};

use crate::client::{AdminClient, BodyMethod, ClientError};

/// How read commands print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable text.
    Text,
    /// The admin API's JSON response, pretty-printed.
    Json,
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The admin API call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A name given on the command line is invalid.
    #[error(transparent)]
    Name(#[from] NameError),
    /// No token from `--token` or `TRIB_ADMIN_TOKEN`.
    #[error("no admin token: pass --token or set TRIB_ADMIN_TOKEN")]
    MissingToken,
    /// Nothing to change in `set-failure-policy`.
    #[error(
        "nothing to change: pass at least one of --max-redelivery-count, --ack-timeout-ms, \
         --base-redelivery-delay-ms, --max-redelivery-delay-ms, --backoff-strategy, \
         --dead-letter-topic, --poison-policy"
    )]
    NothingToChange,
    /// The manifest file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A response that decodes as JSON but not as the documented shape.
    #[error("unexpected admin API response: {0}")]
    Decode(String),
    /// `topics unload` waited `--wait-ms` and the tier service had not
    /// committed everything sealed.
    #[error(
        "{topic} is sealed up to offset {sealed_offset} but tiered only up to {} after \
         {waited_ms} ms: is the tier service running? (call again to keep waiting)",
        tiered_offset.map_or_else(|| "nothing".to_owned(), |o| o.to_string())
    )]
    UnloadPending {
        /// The topic.
        topic: String,
        /// Next offset after the sealed segments.
        sealed_offset: u64,
        /// Next offset after the committed descriptors, if any.
        tiered_offset: Option<u64>,
        /// How long it waited, ms.
        waited_ms: u64,
    },
}

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

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
}

/// Options of `tribctl topics set-failure-policy`.
#[derive(Debug, Args)]
pub struct SetFailurePolicyArgs {
    /// Topic name.
    pub topic: String,
    /// Subscription name.
    #[arg(short = 's', long = "subscription")]
    pub subscription: String,
    /// Redeliveries before the poison policy applies.
    #[arg(long)]
    pub max_redelivery_count: Option<u32>,
    /// Time after which an unacknowledged delivery counts as failed, ms.
    #[arg(long)]
    pub ack_timeout_ms: Option<u64>,
    /// Delay before the first redelivery, ms.
    #[arg(long)]
    pub base_redelivery_delay_ms: Option<u64>,
    /// Cap of the redelivery delay, ms.
    #[arg(long)]
    pub max_redelivery_delay_ms: Option<u64>,
    /// Growth of the delay.
    #[arg(long, value_parser = ["exponential", "fixed", "linear"])]
    pub backoff_strategy: Option<String>,
    /// Topic receiving poison messages; `none` clears it.
    #[arg(long)]
    pub dead_letter_topic: Option<String>,
    /// What happens after the last redelivery.
    #[arg(long, value_parser = ["dead_letter", "block", "none"])]
    pub poison_policy: Option<String>,
}

/// `tribctl namespaces …`.
#[derive(Debug, Subcommand)]
pub enum NamespacesCommand {
    /// Create a namespace (idempotent).
    Create {
        /// Namespace name.
        namespace: String,
    },
    /// List namespaces.
    List,
}

/// `tribctl cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Leader, term, members, last applied index.
    Status,
}

/// Options of `tribctl apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The manifest (YAML): `namespaces: [..]`, `topics: [{name, intent,
    /// partitions}]`.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Print the plan without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// An admin command with what it needs to reach the API.
#[derive(Debug)]
pub struct Context<'a> {
    /// Admin API base URL.
    pub admin_url: &'a str,
    /// Bearer token.
    pub token: Option<&'a str>,
    /// Output format.
    pub output: OutputFormat,
}

impl Context<'_> {
    fn client(&self) -> Result<AdminClient, CommandError> {
        match self.token {
            Some(token) if !token.is_empty() => Ok(AdminClient::new(self.admin_url, token)),
            _ => Err(CommandError::MissingToken),
        }
    }

    /// `value` as this context's output: pretty JSON, or `text(value)`.
    fn render<T: DeserializeOwned>(
        &self,
        value: Value,
        text: impl FnOnce(T) -> String,
    ) -> Result<String, CommandError> {
        match self.output {
            OutputFormat::Json => Ok(pretty(&value)),
            OutputFormat::Text => Ok(text(decode(value)?)),
        }
    }
}

fn pretty(value: &Value) -> String {
    // Serializing a Value cannot fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

fn decode<T: DeserializeOwned>(value: Value) -> Result<T, CommandError> {
    serde_json::from_value(value).map_err(|e| CommandError::Decode(e.to_string()))
}

fn topic_path(topic: &str) -> Result<String, CommandError> {
    let topic = TopicName::new(topic)?;
    Ok(format!(
        "/v1/topics/{}/{}",
        topic.namespace(),
        topic.topic()
    ))
}

fn partitions_text(partitions: u32) -> String {
    match partitions {
        0 => "non-partitioned".to_owned(),
        1 => "1 partition".to_owned(),
        n => format!("{n} partitions"),
    }
}

// ---------------------------------------------------------------------------
// topics
// ---------------------------------------------------------------------------

/// Runs `tribctl topics …`.
///
/// # Errors
/// [`CommandError`].
pub fn topics(ctx: &Context<'_>, command: &TopicsCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        TopicsCommand::Create {
            topic,
            intent,
            partitions,
        } => {
            let body = json!({"name": topic, "intent": intent, "partitions": partitions});
            let value = client.send_json(BodyMethod::Post, "/v1/topics", &body)?;
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
            ctx.render(value, |d: TopicDescription| describe_text(&d))
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
        TopicsCommand::Delete { topic } => {
            let value = client.delete(&topic_path(topic)?)?;
            ctx.render(value, |d: DeleteOutcome| {
                format!(
                    "deleted topic {} ({}, {} metadata keys)\n",
                    d.topic,
                    partitions_text(d.partitions),
                    d.deleted_keys
                )
            })
        }
        TopicsCommand::GetFailurePolicy {
            topic,
            subscription,
        } => {
            let value = client.get(&policy_path(topic, subscription)?, &[])?;
            ctx.render(value, |v: FailurePolicyView| policy_text(&v))
        }
        TopicsCommand::SetFailurePolicy(args) => {
            let patch = patch_body(args);
            if patch.is_empty() {
                return Err(CommandError::NothingToChange);
            }
            let value = client.send_json(
                BodyMethod::Patch,
                &policy_path(&args.topic, &args.subscription)?,
                &Value::Object(patch),
            )?;
            ctx.render(value, |v: FailurePolicyView| policy_text(&v))
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
            let value = client.get(&format!("{}/records", topic_path(topic)?), &query)?;
            ctx.render(value, |r: ReceiveResponse| peek_text(topic, &r))
        }
        TopicsCommand::Seek {
            topic,
            subscription,
            offset,
            timestamp,
        } => {
            let subscription = SubscriptionName::new(subscription)?;
            let body = SeekRequest {
                offset: *offset,
                timestamp_ms: *timestamp,
            };
            let value = client.send_json(
                BodyMethod::Post,
                &format!("{}/subscriptions/{subscription}/seek", topic_path(topic)?),
                &serde_json::to_value(body).map_err(|e| CommandError::Decode(e.to_string()))?,
            )?;
            #[derive(Deserialize)]
            struct Seeked {
                cursor: u64,
            }
            ctx.render(value, |s: Seeked| {
                format!(
                    "subscription {subscription} of {topic}: cursor now {}\n",
                    s.cursor
                )
            })
        }
        TopicsCommand::Unload { topic, wait_ms } => unload(ctx, &client, topic, *wait_ms),
        TopicsCommand::ReplayDlq {
            topic,
            subscription,
        } => {
            let subscription = SubscriptionName::new(subscription)?;
            let value = client.send_json(
                BodyMethod::Post,
                &format!(
                    "{}/subscriptions/{subscription}/replay-dlq",
                    topic_path(topic)?
                ),
                &json!({}),
            )?;
            ctx.render(value, |r: ReplayResponse| {
                let offsets = match (r.offsets.first(), r.offsets.last()) {
                    (Some(first), Some(last)) => format!(" at offsets {first}..={last}"),
                    _ => String::new(),
                };
                format!(
                    "replayed {} message(s) from {} to {topic}{offsets}\n",
                    r.replayed, r.dead_letter_topic
                )
            })
        }
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
        let value = client.send_json(BodyMethod::Post, &path, &json!({}))?;
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

fn policy_path(topic: &str, subscription: &str) -> Result<String, CommandError> {
    let subscription = SubscriptionName::new(subscription)?;
    Ok(format!(
        "{}/subscriptions/{subscription}/failure-policy",
        topic_path(topic)?
    ))
}

/// The PATCH body: only the flags given.
fn patch_body(args: &SetFailurePolicyArgs) -> Map<String, Value> {
    let mut patch = Map::new();
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            patch.insert(key.to_owned(), value);
        }
    };
    set(
        "max_redelivery_count",
        args.max_redelivery_count.map(Value::from),
    );
    set("ack_timeout_ms", args.ack_timeout_ms.map(Value::from));
    set(
        "base_redelivery_delay_ms",
        args.base_redelivery_delay_ms.map(Value::from),
    );
    set(
        "max_redelivery_delay_ms",
        args.max_redelivery_delay_ms.map(Value::from),
    );
    set(
        "backoff_strategy",
        args.backoff_strategy.clone().map(Value::from),
    );
    set("poison_policy", args.poison_policy.clone().map(Value::from));
    set(
        "dead_letter_topic",
        args.dead_letter_topic.as_deref().map(|t| match t {
            "none" => Value::Null,
            topic => Value::from(topic),
        }),
    );
    patch
}

/// The seed's `describe` sample format, then partitions and subscriptions.
fn describe_text(d: &TopicDescription) -> String {
    let broker = d
        .broker_id
        .map_or_else(|| "unassigned".to_owned(), |id| id.to_string());
    let subscriptions = if d.subscriptions.is_empty() {
        "none".to_owned()
    } else {
        d.subscriptions
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "Topic: {}\nBroker ID: {broker}\nDelivery: {}\nIntent: {}\nPartitions: {}\n\
         Subscriptions: {subscriptions}\n",
        d.topic, d.delivery, d.intent_summary, d.partitions
    )
}

fn policy_text(v: &FailurePolicyView) -> String {
    let source = match (v.source, v.persisted) {
        (PolicySource::Stored, _) => "stored".to_owned(),
        (PolicySource::Intent, false) => {
            "inherited from the intent (persisted when the first consumer attaches)".to_owned()
        }
        (PolicySource::BrokerFallback, false) => {
            "broker fallback (persisted when the first consumer attaches)".to_owned()
        }
        (PolicySource::Intent, true) => "inherited from the intent".to_owned(),
        (PolicySource::BrokerFallback, true) => "broker fallback".to_owned(),
    };
    let p = &v.policy;
    format!(
        "Topic: {}\nSubscription: {}\nSource: {source}\nmax_redelivery_count: {}\n\
         ack_timeout_ms: {}\nbase_redelivery_delay_ms: {}\nmax_redelivery_delay_ms: {}\n\
         backoff_strategy: {}\npoison_policy: {}\ndead_letter_topic: {}\n",
        v.topic,
        v.subscription,
        p.max_redelivery_count,
        p.ack_timeout_ms,
        p.base_redelivery_delay_ms,
        p.max_redelivery_delay_ms,
        p.backoff_strategy,
        p.poison_policy,
        p.dead_letter_topic.as_deref().unwrap_or("none"),
    )
}

// ---------------------------------------------------------------------------
// namespaces, cluster, apply
// ---------------------------------------------------------------------------

/// Runs `tribctl namespaces …`.
///
/// # Errors
/// [`CommandError`].
pub fn namespaces(ctx: &Context<'_>, command: &NamespacesCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        NamespacesCommand::Create { namespace } => {
            let namespace = NamespaceName::new(namespace)?;
            let value = client.send_json(
                BodyMethod::Post,
                "/v1/namespaces",
                &json!({"name": namespace}),
            )?;
            #[derive(Deserialize)]
            struct Created {
                namespace: NamespaceName,
                action: PlanAction,
            }
            ctx.render(value, |c: Created| {
                let verb = match c.action {
                    PlanAction::Create => "created",
                    PlanAction::Update => "updated",
                    PlanAction::Unchanged => "unchanged",
                };
                format!("{verb} namespace {}\n", c.namespace)
            })
        }
        NamespacesCommand::List => {
            let value = client.get("/v1/namespaces", &[])?;
            #[derive(Deserialize)]
            struct Namespaces {
                namespaces: Vec<NamespaceName>,
            }
            ctx.render(value, |list: Namespaces| {
                list.namespaces.iter().map(|n| format!("{n}\n")).collect()
            })
        }
    }
}

/// The cluster status as the admin API returns it (a mirror of the
/// broker's `ClusterStatus`; unknown fields are ignored).
#[derive(Debug, Deserialize)]
struct ClusterStatus {
    node_id: u64,
    leader: Option<u64>,
    term: u64,
    #[serde(default)]
    members: BTreeMap<u64, String>,
    last_applied_index: Option<u64>,
    #[serde(default)]
    snapshot_index: Option<u64>,
    #[serde(default)]
    purged_index: Option<u64>,
    state: String,
}

/// Runs `tribctl cluster …`.
///
/// # Errors
/// [`CommandError`].
pub fn cluster(ctx: &Context<'_>, command: &ClusterCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        ClusterCommand::Status => {
            let value = client.get("/v1/cluster/status", &[])?;
            ctx.render(value, |s: ClusterStatus| {
                let index = |i: Option<u64>| i.map_or_else(|| "none".to_owned(), |i| i.to_string());
                let mut text = format!(
                    "Node ID: {}\nState: {}\nLeader: {}\nTerm: {}\nLast applied index: {}\n\
                     Snapshot index: {}\nPurged index: {}\nMembers:\n",
                    s.node_id,
                    s.state,
                    s.leader
                        .map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
                    s.term,
                    index(s.last_applied_index),
                    index(s.snapshot_index),
                    index(s.purged_index),
                );
                for (id, addr) in &s.members {
                    text.push_str(&format!("  {id} {addr}\n"));
                }
                text
            })
        }
    }
}

/// Runs `tribctl apply`: sends the manifest text to the API, which
/// validates everything and applies all of it or nothing.
///
/// # Errors
/// [`CommandError`]; manifest issues come back as
/// [`ClientError::Api`] with `issues`.
pub fn apply(ctx: &Context<'_>, args: &ApplyArgs) -> Result<String, CommandError> {
    let client = ctx.client()?;
    let text = std::fs::read_to_string(&args.file).map_err(|source| CommandError::ReadFile {
        path: args.file.clone(),
        source,
    })?;
    let file = args.file.display().to_string();
    let dry_run = if args.dry_run { "true" } else { "false" };
    let value = client.send(
        BodyMethod::Post,
        "/v1/apply",
        &[("file", &file), ("dry_run", dry_run)],
        "application/yaml",
        text,
    )?;
    ctx.render(value, |report: ApplyReport| plan_text(&report))
}

fn plan_item_text(item: &PlanItem) -> String {
    let mut line = format!(
        "{:<9} {} {}",
        item.action.as_str(),
        item.kind.as_str(),
        item.name
    );
    if item.kind == ItemKind::Topic
        && let (Some(intent), Some(partitions)) = (item.intent, item.partitions)
    {
        line.push_str(&format!(" ({intent}, {})", partitions_text(partitions)));
    }
    if !item.changes.is_empty() {
        let changes: Vec<String> = item
            .changes
            .iter()
            .map(|c| format!("{} {} -> {}", c.field, c.existing, c.requested))
            .collect();
        line.push_str(&format!(": {}", changes.join(", ")));
    }
    line.push('\n');
    line
}

fn plan_text(report: &ApplyReport) -> String {
    let mut text: String = report.plan.items.iter().map(plan_item_text).collect();
    let (create, update, unchanged) = (
        report.plan.count(PlanAction::Create),
        report.plan.count(PlanAction::Update),
        report.plan.count(PlanAction::Unchanged),
    );
    if report.dry_run {
        text.push_str(&format!(
            "dry run: {create} to create, {update} to update, {unchanged} unchanged; \
             nothing applied\n"
        ));
    } else {
        text.push_str(&format!(
            "applied: {create} created, {update} updated, {unchanged} unchanged\n"
        ));
    }
    text
}
