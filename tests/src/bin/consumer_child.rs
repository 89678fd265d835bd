//! A consumer process for `tests/tests/consumers.rs`: attaches to a shared
//! subscription through the Rust consumer client, leases batches, records
//! each offset it processes in a file (one line per offset, written before
//! the ack), then acknowledges the batch. A SIGKILL at any instant leaves a
//! file listing everything processed; the broker's cursor says what was
//! acknowledged.
//!
//! `consumer_child URL TOKEN TOPIC SUBSCRIPTION OUT_FILE [--until-empty]
//! [--exclusive] [--name NAME]`: with `--until-empty` it exits 0 once three
//! receives in a row come back empty and the cursor reached the high-water
//! mark; otherwise it runs until killed. `--exclusive` attaches to an
//! exclusive subscription (default shared); `--name` sets the
//! `consumer_name` (default `child-PID`). An attach the broker refuses
//! exits 3 after printing the refusal on stderr.

use std::io::Write;
use std::time::Duration;

use tributary_api::consumer::{AttachRequest, StartPosition, SubscriptionType};
use tributary_api::consumer_client::{ClientError, ConsumerClient};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, token, topic, subscription, out, rest @ ..] = args.as_slice() else {
        anyhow::bail!(
            "usage: consumer_child URL TOKEN TOPIC SUBSCRIPTION OUT_FILE [--until-empty]"
        );
    };
    let until_empty = rest.iter().any(|a| a == "--until-empty");
    let exclusive = rest.iter().any(|a| a == "--exclusive");
    let name = rest
        .iter()
        .position(|a| a == "--name")
        .and_then(|i| rest.get(i + 1))
        .cloned()
        .unwrap_or_else(|| format!("child-{}", std::process::id()));
    let client = ConsumerClient::new(url, token);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    let attach = AttachRequest {
        subscription_type: if exclusive {
            SubscriptionType::Exclusive
        } else {
            SubscriptionType::Shared
        },
        start: StartPosition::Earliest,
        consumer_name: Some(name),
        ..AttachRequest::default()
    };
    let mut consumer = match client.attach(topic, subscription, &attach) {
        Ok(attached) => attached.consumer_id,
        Err(e @ ClientError::Api { .. }) => {
            eprintln!("attach refused: {e}");
            std::process::exit(3);
        }
        Err(e) => return Err(e.into()),
    };
    let mut empty = 0;
    loop {
        let batch = match client.receive(topic, subscription, consumer, 10, 300) {
            Ok(batch) => batch,
            Err(ClientError::Api { status: 404, .. }) => {
                consumer = client.attach(topic, subscription, &attach)?.consumer_id;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if batch.messages.is_empty() {
            empty += 1;
            if until_empty && empty >= 3 && batch.cursor >= batch.high_water_mark {
                return Ok(());
            }
            continue;
        }
        empty = 0;
        // "Processing": each offset is recorded (flushed to the kernel, so
        // a SIGKILL keeps it) before it is acknowledged, as a real consumer
        // finishes its side effect before acking.
        let mut lines = String::new();
        for m in &batch.messages {
            lines.push_str(&format!("{}\n", m.offset));
        }
        file.write_all(lines.as_bytes())?;
        file.flush()?;
        std::thread::sleep(Duration::from_millis(20));
        let offsets: Vec<u64> = batch.messages.iter().map(|m| m.offset).collect();
        match client.ack(topic, subscription, consumer, &offsets) {
            Ok(_) => {}
            // The lease moved on (expired): it is redelivered; not ours.
            Err(ClientError::Api {
                status: 409 | 404, ..
            }) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
