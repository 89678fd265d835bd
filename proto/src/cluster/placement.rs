//! The load manager's rules, without I/O: given what `/cluster/*` holds
//! (a [`ClusterSnapshot`]), which topics go where ([`Change`]s). The broker
//! on the Raft leader carries each change out as one transaction whose
//! precondition is the exact value it replaces, so two managers that both
//! believe they lead cannot both apply a change for the same topic.
//!
//! Rules:
//! - **Unassigned topics** go to their pinned broker (only it; they wait
//!   while it is dead), else to the broker they prefer if it is live and
//!   active, else to the live active broker owning the fewest topics
//!   (ties: lowest id).
//! - **A dead owner's topics** (its lease lapsed) go the same way, at the
//!   next epoch.
//! - **Hysteresis.** A live owner never loses a topic to [`plan`]: topics
//!   move away from a live broker only on an explicit move, a drain or a
//!   rebalance ([`plan_rebalance`]), and a rebalance moves a topic only
//!   while the most and least loaded brokers differ by two topics or more,
//!   so a balanced cluster never oscillates.

use std::collections::{BTreeMap, BTreeSet};

use super::{Assignment, BrokerLifecycle, Unassigned, pinned_broker};
use crate::keys::TopicName;

/// What `/cluster/*` holds, as the load manager reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterSnapshot {
    /// Brokers holding a lease, with their lifecycle.
    pub live: BTreeMap<u64, BrokerLifecycle>,
    /// Assigned topics: owner and assignment.
    pub assignments: BTreeMap<TopicName, (u64, Assignment)>,
    /// Topics waiting for an owner.
    pub unassigned: BTreeMap<TopicName, Unassigned>,
    /// Wall-clock instant, ms, before which no dead owner's topics are
    /// taken over: a new Raft leader's first moments (the broker's
    /// takeover grace). While there was no leader nobody could renew a
    /// lease, so at an election every lease may have lapsed, the live
    /// owners' too; they renew with the new leader within that time (as
    /// KRaft's controller gives every broker a fresh session timeout when
    /// it takes over). Without it the survivors
    /// of a leader's crash lost their topics to a new epoch, and a central
    /// topic's new owner started at the archive's end. 0: no such wait.
    pub takeovers_from_ms: u64,
    /// Brokers the Raft leader knows to be gone: members of the Raft group
    /// that have not answered it in its term. Their topics are taken over
    /// without waiting for `takeovers_from_ms` (a leader that died with
    /// its topics lets them go after the election, not the election plus
    /// the wait); the takeover still needs their lease lapsed.
    pub unreachable: BTreeSet<u64>,
}

/// What a change replaces.
#[derive(Debug, Clone, PartialEq)]
pub enum Previous {
    /// The topic's `/cluster/unassigned/...` entry.
    Unassigned(Unassigned),
    /// Its current owner and assignment.
    Owner(u64, Assignment),
}

impl Previous {
    /// The epoch this change supersedes.
    pub fn epoch(&self) -> u64 {
        match self {
            Previous::Unassigned(u) => u.last_epoch,
            Previous::Owner(_, a) => a.epoch,
        }
    }

    fn owner(&self) -> Option<u64> {
        match self {
            Previous::Unassigned(u) => u.last_owner,
            Previous::Owner(owner, _) => Some(*owner),
        }
    }
}

/// One placement decision: `topic` moves from `previous` to broker `to`
/// with `assignment` (epoch one above `previous`'s).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The topic.
    pub topic: TopicName,
    /// What the change replaces (the transaction's precondition).
    pub previous: Previous,
    /// The new owner.
    pub to: u64,
    /// The new assignment.
    pub assignment: Assignment,
}

impl Change {
    /// The broker that owned the topic before, if any.
    pub fn previous_owner(&self) -> Option<u64> {
        self.previous.owner()
    }
}

fn change(topic: &TopicName, previous: Previous, to: u64, reason: &str, now_ms: u64) -> Change {
    Change {
        topic: topic.clone(),
        assignment: Assignment {
            epoch: previous.epoch() + 1,
            assigned_at_ms: now_ms,
            previous_owner: previous.owner(),
            reason: reason.to_owned(),
        },
        previous,
        to,
    }
}

/// Topics owned per live broker (live brokers owning none count 0).
fn load(snapshot: &ClusterSnapshot) -> BTreeMap<u64, u64> {
    let mut load: BTreeMap<u64, u64> = snapshot.live.keys().map(|&id| (id, 0)).collect();
    for (owner, _) in snapshot.assignments.values() {
        if let Some(count) = load.get_mut(owner) {
            *count += 1;
        }
    }
    load
}

/// The live active broker with the fewest topics (ties: lowest id),
/// other than `except`.
fn least_loaded(
    snapshot: &ClusterSnapshot,
    load: &BTreeMap<u64, u64>,
    except: Option<u64>,
) -> Option<u64> {
    load.iter()
        .filter(|(id, _)| Some(**id) != except && is_active(snapshot, **id))
        .min_by_key(|(id, count)| (**count, **id))
        .map(|(id, _)| *id)
}

fn is_active(snapshot: &ClusterSnapshot, id: u64) -> bool {
    snapshot.live.get(&id) == Some(&BrokerLifecycle::Active)
}

/// Where a topic without a (live) owner goes: its pinned broker, else the
/// broker it prefers, else the least loaded. `None`: it waits.
fn target(
    snapshot: &ClusterSnapshot,
    load: &BTreeMap<u64, u64>,
    topic: &TopicName,
    prefer: Option<u64>,
) -> Option<u64> {
    if let Some(pinned) = pinned_broker(topic) {
        return snapshot.live.contains_key(&pinned).then_some(pinned);
    }
    if let Some(prefer) = prefer.filter(|&p| is_active(snapshot, p)) {
        return Some(prefer);
    }
    least_loaded(snapshot, load, None)
}

/// The source topic of a dead-letter topic named by the default rule
/// (`{topic}-dlq`, as the `task_queue` intent names it).
fn source_of(topic: &TopicName) -> Option<TopicName> {
    let source = topic.as_str().strip_suffix("-dlq")?;
    TopicName::new(source).ok()
}

/// Where a dead owner's `topic` should go to stay with its companion: a
/// dead-letter topic `{t}-dlq` with `{t}`'s (new or live) owner, a topic
/// with the live owner of its dead-letter topic. A dead-letter copy is
/// appended only on the broker that owns the dead-letter topic, and a
/// centrally written topic does not move while its owner lives, so a topic
/// placed apart from its dead-letter topic made every poison message wait
/// (a trial after a crash and a rebalance). Only the default name is
/// known here; a failure policy naming another topic is not followed.
fn companion_owner(
    snapshot: &ClusterSnapshot,
    placed: &BTreeMap<TopicName, u64>,
    topic: &TopicName,
) -> Option<u64> {
    let live_owner = |t: &TopicName| {
        placed.get(t).copied().or_else(|| {
            let (owner, _) = snapshot.assignments.get(t)?;
            snapshot.live.contains_key(owner).then_some(*owner)
        })
    };
    match source_of(topic) {
        Some(source) => live_owner(&source),
        None => TopicName::new(&format!("{topic}-dlq"))
            .ok()
            .and_then(|dlq| live_owner(&dlq)),
    }
}

/// The reason of a change that takes a topic from a broker whose lease
/// lapsed. Carrying it out requires that lease to be lapsed still when the
/// change is applied, not only in the view it was planned from.
pub const OWNER_DEAD: &str = "owner_dead";

/// The changes that give every unassigned topic, and every topic of a dead
/// broker, a live owner. A live owner keeps its topics.
pub fn plan(snapshot: &ClusterSnapshot, now_ms: u64) -> Vec<Change> {
    let mut load = load(snapshot);
    let mut out = Vec::new();
    for (topic, waiting) in &snapshot.unassigned {
        if snapshot.assignments.contains_key(topic) {
            continue; // a stale queue entry; the assignment wins
        }
        if let Some(to) = target(snapshot, &load, topic, waiting.prefer) {
            *load.entry(to).or_default() += 1;
            let reason = if waiting.reason == "local_data" {
                "local_data"
            } else if pinned_broker(topic).is_some() {
                "pinned"
            } else {
                "new_topic"
            };
            out.push(change(
                topic,
                Previous::Unassigned(waiting.clone()),
                to,
                reason,
                now_ms,
            ));
        }
    }
    // A dead owner's topics, dead-letter topics last: each follows the
    // topic it takes the dead letters of ([`companion_owner`]).
    let mut orphans: Vec<(&TopicName, &u64, &Assignment)> = (snapshot.assignments.iter())
        .filter(|(_, (owner, _))| {
            !snapshot.live.contains_key(owner)
                && (now_ms >= snapshot.takeovers_from_ms || snapshot.unreachable.contains(owner))
        })
        .map(|(topic, (owner, assignment))| (topic, owner, assignment))
        .collect();
    orphans.sort_by_key(|(topic, _, _)| source_of(topic).is_some());
    let mut placed: BTreeMap<TopicName, u64> = BTreeMap::new();
    for (topic, owner, assignment) in orphans {
        let prefer = companion_owner(snapshot, &placed, topic);
        if let Some(to) = target(snapshot, &load, topic, prefer) {
            placed.insert(topic.clone(), to);
            *load.entry(to).or_default() += 1;
            out.push(change(
                topic,
                Previous::Owner(*owner, assignment.clone()),
                to,
                OWNER_DEAD,
                now_ms,
            ));
        }
    }
    out
}

/// Why a move cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoveError {
    /// The topic has no owner to move it from.
    #[error("topic {0} has no owner (it waits for the load manager)")]
    NotAssigned(TopicName),
    /// The target holds no lease or is draining.
    #[error(
        "broker {0} is not a live, active member of the cluster (no lease, or draining; see `tribctl cluster status`)"
    )]
    TargetNotLive(u64),
    /// The topic already lives there.
    #[error("topic {topic} is already owned by broker {broker}")]
    AlreadyThere {
        /// The topic.
        topic: TopicName,
        /// Its owner.
        broker: u64,
    },
    /// A pinned topic stays with its broker.
    #[error("topic {topic} is pinned to broker {broker}")]
    Pinned {
        /// The topic.
        topic: TopicName,
        /// The broker it is pinned to.
        broker: u64,
    },
}

/// An explicit move of `topic` to broker `to` (`tribctl topics move`).
///
/// # Errors
/// [`MoveError`].
pub fn plan_move(
    snapshot: &ClusterSnapshot,
    topic: &TopicName,
    to: u64,
    reason: &str,
    now_ms: u64,
) -> Result<Change, MoveError> {
    let Some((owner, assignment)) = snapshot.assignments.get(topic) else {
        return Err(MoveError::NotAssigned(topic.clone()));
    };
    if let Some(pinned) = pinned_broker(topic) {
        return Err(MoveError::Pinned {
            topic: topic.clone(),
            broker: pinned,
        });
    }
    if *owner == to {
        return Err(MoveError::AlreadyThere {
            topic: topic.clone(),
            broker: to,
        });
    }
    if !is_active(snapshot, to) {
        return Err(MoveError::TargetNotLive(to));
    }
    Ok(change(
        topic,
        Previous::Owner(*owner, assignment.clone()),
        to,
        reason,
        now_ms,
    ))
}

/// Moves that even out topic counts across live active brokers: from the
/// most to the least loaded while they differ by two or more, at most
/// `max_moves`. Pinned topics and the topics of `stay` (centrally written
/// ones: their new owner would start at the archive's end, without what
/// the live owner has not archived yet) stay, and count for their owner's
/// load.
pub fn plan_rebalance(
    snapshot: &ClusterSnapshot,
    now_ms: u64,
    max_moves: usize,
    stay: &BTreeSet<TopicName>,
) -> Vec<Change> {
    let mut load = load(snapshot);
    let mut owned: BTreeMap<u64, Vec<&TopicName>> = BTreeMap::new();
    for (topic, (owner, _)) in &snapshot.assignments {
        // A topic whose dead-letter topic stays with its owner stays too
        // (apart, its poison messages would wait).
        let keeps_dead_letters = TopicName::new(&format!("{topic}-dlq"))
            .ok()
            .is_some_and(|dlq| {
                stay.contains(&dlq) && snapshot.assignments.get(&dlq).map(|(o, _)| o) == Some(owner)
            });
        if pinned_broker(topic).is_none() && !stay.contains(topic) && !keeps_dead_letters {
            owned.entry(*owner).or_default().push(topic);
        }
    }
    let mut out = Vec::new();
    while out.len() < max_moves {
        let Some(to) = least_loaded(snapshot, &load, None) else {
            break;
        };
        let Some((&from, &most)) = load
            .iter()
            .filter(|(id, _)| owned.get(id).is_some_and(|t| !t.is_empty()))
            .max_by_key(|(id, count)| (**count, std::cmp::Reverse(**id)))
        else {
            break;
        };
        if most < load[&to] + 2 {
            break;
        }
        let Some(topic) = owned.get_mut(&from).and_then(Vec::pop) else {
            break;
        };
        let (_, assignment) = &snapshot.assignments[topic];
        out.push(change(
            topic,
            Previous::Owner(from, assignment.clone()),
            to,
            "rebalance",
            now_ms,
        ));
        *load.entry(from).or_default() -= 1;
        *load.entry(to).or_default() += 1;
    }
    out
}

/// The hand-over of every topic of `broker` (a drain, or a SIGTERM'd
/// broker): each goes to the least loaded other live active broker. Pinned
/// topics stay. Empty when no other broker is live.
pub fn plan_drain(snapshot: &ClusterSnapshot, broker: u64, now_ms: u64) -> Vec<Change> {
    let mut load = load(snapshot);
    let mut out = Vec::new();
    for (topic, (owner, assignment)) in &snapshot.assignments {
        if *owner != broker || pinned_broker(topic).is_some() {
            continue;
        }
        let Some(to) = least_loaded(snapshot, &load, Some(broker)) else {
            break;
        };
        *load.entry(to).or_default() += 1;
        out.push(change(
            topic,
            Previous::Owner(broker, assignment.clone()),
            to,
            "drain",
            now_ms,
        ));
    }
    out
}
