//! The subscription commands of `tribctl topics …`: show and override a
//! subscription's failure policy, seek its cursor, replay its dead-lettered
//! messages.

use clap::Args;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tributary_api::admin::FailurePolicyView;
use tributary_api::admin::PolicySource;
use tributary_api::client::Method;
use tributary_api::consumer::{ReplayResponse, SeekRequest};
use tributary_proto::keys::SubscriptionName;

use super::{CommandError, Context, topic_path};
use crate::client::AdminClient;

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

/// `tribctl topics get-failure-policy`.
pub(super) fn get_failure_policy(
    ctx: &Context<'_>,
    client: &AdminClient,
    topic: &str,
    subscription: &str,
) -> Result<String, CommandError> {
    let value = client.get(&policy_path(topic, subscription)?, &[])?;
    ctx.render(value, |v: FailurePolicyView| policy_text(&v))
}

/// `tribctl topics set-failure-policy`: PATCHes only the flags given.
pub(super) fn set_failure_policy(
    ctx: &Context<'_>,
    client: &AdminClient,
    args: &SetFailurePolicyArgs,
) -> Result<String, CommandError> {
    let patch = patch_body(args);
    if patch.is_empty() {
        return Err(CommandError::NothingToChange);
    }
    let value = client.send_json(
        Method::Patch,
        &policy_path(&args.topic, &args.subscription)?,
        &Value::Object(patch),
    )?;
    ctx.render(value, |v: FailurePolicyView| policy_text(&v))
}

/// `tribctl topics seek`.
pub(super) fn seek(
    ctx: &Context<'_>,
    client: &AdminClient,
    topic: &str,
    subscription: &str,
    offset: Option<u64>,
    timestamp: Option<i64>,
) -> Result<String, CommandError> {
    let subscription = SubscriptionName::new(subscription)?;
    let body = SeekRequest {
        offset,
        timestamp_ms: timestamp,
    };
    let value = client.send_json(
        Method::Post,
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

/// `tribctl topics replay-dlq`.
pub(super) fn replay_dlq(
    ctx: &Context<'_>,
    client: &AdminClient,
    topic: &str,
    subscription: &str,
) -> Result<String, CommandError> {
    let subscription = SubscriptionName::new(subscription)?;
    let value = client.send_json(
        Method::Post,
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
