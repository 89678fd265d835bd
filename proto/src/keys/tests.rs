//! Tests of every name rule, key path and parser of [`super`].

use proptest::prelude::*;
use proptest::strategy::Union;

use super::*;

fn topic(name: &str) -> TopicName {
    TopicName::new(name).expect("valid topic name")
}

fn sub(name: &str) -> SubscriptionName {
    SubscriptionName::new(name).expect("valid subscription name")
}

fn topic_err(name: &str) -> NameErrorKind {
    let err = TopicName::new(name).expect_err("invalid topic name");
    assert_eq!(err.what, NamePart::TopicName);
    assert_eq!(err.input, name);
    err.kind
}

// ---- topic name rules -------------------------------------------------

#[test]
fn valid_topic_names_split_into_parts() {
    let t = topic("/default/agent-jobs");
    assert_eq!(t.as_str(), "/default/agent-jobs");
    assert_eq!(t.namespace(), "default");
    assert_eq!(t.topic(), "agent-jobs");
    assert_eq!(t.namespace_name().as_str(), "default");
    let t = topic("/Ns.1_x/t.-_Z9");
    assert_eq!((t.namespace(), t.topic()), ("Ns.1_x", "t.-_Z9"));
    // Dots are fine inside a name, only "." and ".." alone are refused.
    assert_eq!(topic("/.a/...").topic(), "...");
}

#[test]
fn topic_name_rejects_empty_input_and_empty_parts() {
    assert_eq!(
        topic_err(""),
        NameErrorKind::Empty {
            part: NamePart::TopicName
        }
    );
    assert_eq!(
        topic_err("//b"),
        NameErrorKind::Empty {
            part: NamePart::Namespace
        }
    );
    assert_eq!(
        topic_err("/a/"),
        NameErrorKind::Empty {
            part: NamePart::Topic
        }
    );
}

#[test]
fn topic_name_requires_leading_slash() {
    assert_eq!(
        topic_err("default/jobs"),
        NameErrorKind::MissingLeadingSlash {
            part: NamePart::TopicName
        }
    );
}

#[test]
fn topic_name_requires_exactly_two_parts() {
    for (name, found) in [
        ("/a", 1),
        ("/", 1),
        ("/a/b/c", 3),
        ("/a/b/", 3),
        ("/a//b", 3),
    ] {
        assert_eq!(
            topic_err(name),
            NameErrorKind::WrongPartCount {
                part: NamePart::TopicName,
                expected: 2,
                found
            },
            "{name}"
        );
    }
}

#[test]
fn topic_name_rejects_dot_parts() {
    for (name, part) in [
        ("/./b", NamePart::Namespace),
        ("/../b", NamePart::Namespace),
        ("/a/.", NamePart::Topic),
        ("/a/..", NamePart::Topic),
    ] {
        assert_eq!(topic_err(name), NameErrorKind::DotName { part }, "{name}");
    }
}

#[test]
fn topic_name_rejects_control_characters() {
    assert_eq!(
        topic_err("/a/b\nc"),
        NameErrorKind::ControlChar {
            part: NamePart::Topic,
            ch: '\n',
            at: 1
        }
    );
    assert_eq!(
        topic_err("/\0/b"),
        NameErrorKind::ControlChar {
            part: NamePart::Namespace,
            ch: '\0',
            at: 0
        }
    );
    assert_eq!(
        topic_err("/a/x\u{7f}"),
        NameErrorKind::ControlChar {
            part: NamePart::Topic,
            ch: '\u{7f}',
            at: 1
        }
    );
    assert_eq!(
        topic_err("/a/\u{85}"),
        NameErrorKind::ControlChar {
            part: NamePart::Topic,
            ch: '\u{85}',
            at: 0
        }
    );
}

#[test]
fn topic_name_rejects_characters_outside_the_set() {
    for (name, ch, at) in [
        ("/a/b c", ' ', 1),
        ("/a/é", 'é', 0),
        ("/a/b*", '*', 1),
        ("/a:b/c", ':', 1),
        ("/a/b\\c", '\\', 1),
        ("/a/b%2F", '%', 1),
        ("/a/b+c", '+', 1),
    ] {
        let kind = topic_err(name);
        let part = if name.starts_with("/a/") {
            NamePart::Topic
        } else {
            NamePart::Namespace
        };
        assert_eq!(
            kind,
            NameErrorKind::DisallowedChar { part, ch, at },
            "{name}"
        );
    }
    let message = TopicName::new("/a/b c").unwrap_err().to_string();
    assert_eq!(
        message,
        "invalid topic name \"/a/b c\": topic contains ' ' at byte 1; \
         allowed: ASCII letters, digits, '-', '_', '.'"
    );
}

#[test]
fn topic_name_length_limit_is_255_bytes_in_total() {
    let max = format!("/ns/{}", "t".repeat(MAX_NAME_BYTES - 4));
    assert_eq!(max.len(), 255);
    assert_eq!(topic(&max).as_str(), max);
    let over = format!("{max}t");
    assert_eq!(
        topic_err(&over),
        NameErrorKind::TooLong {
            part: NamePart::TopicName,
            len: 256,
            max: 255
        }
    );
}

#[test]
fn single_names_follow_the_same_rules() {
    type Check = fn(&str) -> Result<(), NameError>;
    let checks: [(NamePart, Check); 6] = [
        (NamePart::Namespace, |s| NamespaceName::new(s).map(drop)),
        (NamePart::Subscription, |s| {
            SubscriptionName::new(s).map(drop)
        }),
        (NamePart::Subject, |s| SubjectName::new(s).map(drop)),
        (NamePart::Role, |s| RoleName::new(s).map(drop)),
        (NamePart::Binding, |s| BindingId::new(s).map(drop)),
        (NamePart::Principal, |s| PrincipalName::new(s).map(drop)),
    ];
    for (part, check) in checks {
        assert_eq!(check("worker-pool.v2_A"), Ok(()), "{part}");
        let kind = |s: &str| {
            let err = check(s).expect_err(s);
            assert_eq!((err.what, err.input.as_str()), (part, s));
            err.kind
        };
        assert_eq!(kind(""), NameErrorKind::Empty { part });
        assert_eq!(kind("."), NameErrorKind::DotName { part });
        assert_eq!(kind(".."), NameErrorKind::DotName { part });
        assert_eq!(
            kind("a\tb"),
            NameErrorKind::ControlChar {
                part,
                ch: '\t',
                at: 1
            }
        );
        assert_eq!(
            kind("a/b"),
            NameErrorKind::DisallowedChar {
                part,
                ch: '/',
                at: 1
            }
        );
        assert_eq!(
            kind("ab\u{e9}"),
            NameErrorKind::DisallowedChar {
                part,
                ch: '\u{e9}',
                at: 2
            }
        );
        assert_eq!(check(&"x".repeat(255)), Ok(()));
        assert_eq!(
            kind(&"x".repeat(256)),
            NameErrorKind::TooLong {
                part,
                len: 256,
                max: 255
            }
        );
    }
}

#[test]
fn subjects_starting_with_underscore_are_reserved() {
    for reserved in ["_global", "_index", "_x"] {
        assert_eq!(
            SubjectName::new(reserved).unwrap_err().kind,
            NameErrorKind::Reserved {
                part: NamePart::Subject
            }
        );
    }
    // Only subjects: other names may start with '_'.
    assert!(SubscriptionName::new("_internal").is_ok());
}

#[test]
fn names_serialize_as_strings_and_validate_when_deserialized() {
    let t = topic("/default/agent-jobs");
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(json, "\"/default/agent-jobs\"");
    assert_eq!(serde_json::from_str::<TopicName>(&json).unwrap(), t);
    assert!(serde_json::from_str::<TopicName>("\"/a/b/c\"").is_err());
    assert_eq!(
        serde_json::from_str::<SubscriptionName>("\"worker-pool\"").unwrap(),
        sub("worker-pool")
    );
    assert!(serde_json::from_str::<SubscriptionName>("\"a b\"").is_err());
}

// ---- partitions and suffixes ------------------------------------------

#[test]
fn partitions_append_part_n() {
    let t = topic("/default/agent-jobs");
    let p = t.partition(2).unwrap();
    assert_eq!(p.as_str(), "/default/agent-jobs-part-2");
    assert_eq!(p.partition_of(), Some((t.clone(), 2)));
    assert_eq!(t.partition_of(), None);
    assert_eq!(topic("/a/b-part-01").partition_of(), None);
    assert_eq!(topic("/a/b-part-").partition_of(), None);
    assert_eq!(topic("/a/-part-1").partition_of(), None);
    assert_eq!(topic("/a/b-part-4294967296").partition_of(), None);
    assert_eq!(
        topic("/a/x-part-1-part-2").partition_of(),
        Some((topic("/a/x-part-1"), 2))
    );
    let long = topic(&format!("/n/{}", "t".repeat(250)));
    assert!(matches!(
        long.partition(0).unwrap_err().kind,
        NameErrorKind::TooLong { len: 260, .. }
    ));
}

#[test]
fn with_suffix_builds_dead_letter_topics() {
    let t = topic("/default/agent-jobs");
    assert_eq!(
        t.with_suffix("-dlq").unwrap().as_str(),
        "/default/agent-jobs-dlq"
    );
    assert!(matches!(
        t.with_suffix("/x").unwrap_err().kind,
        NameErrorKind::WrongPartCount { found: 3, .. }
    ));
    assert!(matches!(
        t.with_suffix(" dlq").unwrap_err().kind,
        NameErrorKind::DisallowedChar { ch: ' ', .. }
    ));
}

// ---- every key path, pinned -------------------------------------------

#[test]
fn cluster_keys() {
    let t = topic("/default/jobs");
    assert_eq!(cluster::leader(), "/cluster/leader");
    assert_eq!(cluster::id(), "/cluster/id");
    assert_eq!(edge::cluster(), "/edge/cluster");
    assert_eq!(cluster::register(7), "/cluster/register/7");
    assert_eq!(cluster::register_prefix(), "/cluster/register/");
    assert_eq!(cluster::broker_state(7), "/cluster/brokers/7/state");
    assert_eq!(
        cluster::broker_assignment(7, &t),
        "/cluster/brokers/7/default/jobs"
    );
    assert_eq!(cluster::broker_prefix(7), "/cluster/brokers/7/");
    assert_eq!(cluster::unassigned(&t), "/cluster/unassigned/default/jobs");
    assert_eq!(cluster::unassigned_prefix(), "/cluster/unassigned/");
    assert_eq!(cluster::load(7), "/cluster/load/7");
    assert_eq!(cluster::load_prefix(), "/cluster/load/");
    assert_eq!(cluster::load_balance(), "/cluster/load_balance");
    assert_eq!(
        cluster::rebalancing_history(1_700_000_000_000),
        "/cluster/rebalancing_history/00000001700000000000"
    );
    assert_eq!(
        cluster::rebalancing_history_prefix(),
        "/cluster/rebalancing_history/"
    );
}

#[test]
fn namespace_keys() {
    let ns = NamespaceName::new("default").unwrap();
    assert_eq!(namespaces::policy(&ns), "/namespaces/default/policy");
    assert_eq!(
        namespaces::topic(&topic("/default/jobs")),
        "/namespaces/default/topics/default/jobs"
    );
    assert_eq!(
        namespaces::topics_prefix(&ns),
        "/namespaces/default/topics/"
    );
    assert_eq!(namespaces::prefix(&ns), "/namespaces/default/");
    assert_eq!(namespaces::all_prefix(), "/namespaces/");
}

#[test]
fn topic_keys() {
    let t = topic("/default/jobs");
    let s = sub("worker-pool");
    assert_eq!(topics::marker(&t), "/topics/default/jobs");
    assert_eq!(topics::delivery(&t), "/topics/default/jobs/delivery");
    assert_eq!(topics::policy(&t), "/topics/default/jobs/policy");
    assert_eq!(topics::intent(&t), "/topics/default/jobs/intent");
    assert_eq!(
        topics::producer(&t, 42),
        "/topics/default/jobs/producers/42"
    );
    assert_eq!(
        topics::producers_prefix(&t),
        "/topics/default/jobs/producers/"
    );
    assert_eq!(
        topics::hole(&t, 1250),
        "/topics/default/jobs/holes/00000000000000001250"
    );
    assert!(topics::hole(&t, 7).starts_with(&topics::holes_prefix(&t)));
    assert_eq!(
        topics::subscription(&t, &s),
        "/topics/default/jobs/subscriptions/worker-pool"
    );
    assert_eq!(
        topics::subscription_cursor(&t, &s),
        "/topics/default/jobs/subscriptions/worker-pool/cursor"
    );
    assert_eq!(
        topics::subscription_failure_policy(&t, &s),
        "/topics/default/jobs/subscriptions/worker-pool/failure_policy"
    );
    assert_eq!(
        topics::subscription_dispatch_config(&t, &s),
        "/topics/default/jobs/subscriptions/worker-pool/dispatch_config"
    );
    assert_eq!(
        topics::subscriptions_prefix(&t),
        "/topics/default/jobs/subscriptions/"
    );
    assert_eq!(topics::topic_prefix(&t), "/topics/default/jobs/");
    assert_eq!(
        topics::namespace_prefix(&t.namespace_name()),
        "/topics/default/"
    );
    assert_eq!(topics::all_prefix(), "/topics/");
}

#[test]
fn schema_auth_and_edge_keys() {
    let subject = SubjectName::new("orders-value").unwrap();
    assert_eq!(schemas::next_schema_id(), "/schemas/_global/next_schema_id");
    assert_eq!(
        schemas::metadata(&subject),
        "/schemas/orders-value/metadata"
    );
    assert_eq!(
        schemas::compatibility(&subject),
        "/schemas/orders-value/compatibility"
    );
    assert_eq!(schemas::by_id(9), "/schemas/_index/by_id/9");
    assert_eq!(
        auth::role(&RoleName::new("admin").unwrap()),
        "/auth/roles/admin"
    );
    assert_eq!(
        auth::binding(&BindingId::new("b-1").unwrap()),
        "/auth/bindings/b-1"
    );
    assert_eq!(
        auth::principal(&PrincipalName::new("tier-1").unwrap()),
        "/auth/principals/tier-1"
    );
    assert_eq!(
        MetadataKey::parse("/auth/principals/tier-1").unwrap(),
        MetadataKey::AuthPrincipal {
            principal: PrincipalName::new("tier-1").unwrap()
        }
    );
    assert!(MetadataKey::parse("/auth/principals/a/b").is_err());
    assert!(MetadataKey::parse("/auth/principals/..").is_err());
    assert_eq!(auth::principals_prefix(), "/auth/principals/");
    assert_eq!(auth::roles_prefix(), "/auth/roles/");
    assert_eq!(auth::bindings_prefix(), "/auth/bindings/");
    assert_eq!(auth::prefix(), "/auth/");
    let plant = NamespaceName::new("plant-1").unwrap();
    assert_eq!(auth::enrollment(&plant), "/auth/enrollments/plant-1");
    assert_eq!(auth::revoked_edge(&plant), "/auth/revoked_edges/plant-1");
    assert_eq!(auth::enrollments_prefix(), "/auth/enrollments/");
    assert_eq!(auth::revoked_edges_prefix(), "/auth/revoked_edges/");
    assert!(auth::enrollment(&plant).starts_with(&auth::prefix()));
    assert!(auth::revoked_edge(&plant).starts_with(&auth::prefix()));
    assert_eq!(
        MetadataKey::parse("/auth/revoked_edges/plant-1").unwrap(),
        MetadataKey::AuthRevokedEdge {
            edge: plant.clone()
        }
    );
    assert!(MetadataKey::parse("/auth/enrollments/a/b").is_err());
    assert!(MetadataKey::parse("/auth/revoked_edges/..").is_err());
    assert_eq!(
        edge::checkpoint(&topic("/edge1/sensors")),
        "/edge/checkpoints/edge1/sensors"
    );
    assert_eq!(edge::checkpoints_prefix(), "/edge/checkpoints/");
}

#[test]
fn fleet_edge_keys() {
    let plant = NamespaceName::new("plant-7").unwrap();
    assert_eq!(fleet::edge_entry(&plant, 3), "/fleet/edges/plant-7/3");
    assert_eq!(
        MetadataKey::parse("/fleet/edges/plant-7/3"),
        Ok(MetadataKey::FleetEdge {
            edge: plant,
            broker_id: 3
        })
    );
    assert!(
        fleet::edge_entry(&NamespaceName::new("e").unwrap(), 1).starts_with(&fleet::edges_prefix())
    );
    for bad in [
        "/fleet/edges/plant-7/03",
        "/fleet/edges/plant-7/x",
        "/fleet/edges/pl ant/3",
        "/fleet/edges/plant-7",
        "/fleet/edges/plant-7/3/extra",
    ] {
        assert!(MetadataKey::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn storage_keys_with_default_prefix() {
    let keys = StorageKeys::default();
    let t = topic("/default/jobs");
    assert_eq!(keys.prefix(), "/tributary");
    assert_eq!(
        keys.segment_descriptor(&t, 1234),
        "/tributary/storage/topics/default/jobs/segments/00000000000000001234"
    );
    assert_eq!(
        keys.segments_cur(&t),
        "/tributary/storage/topics/default/jobs/segments/cur"
    );
    assert_eq!(
        keys.segments_prefix(&t),
        "/tributary/storage/topics/default/jobs/segments/"
    );
    assert_eq!(
        keys.topic_state(&t),
        "/tributary/storage/topics/default/jobs/state"
    );
    assert_eq!(
        keys.segment_object(&t, 0, 99),
        "tributary/storage/topics/default/jobs/segments/\
         00000000000000000000-00000000000000000099.seg"
    );
    assert_eq!(
        keys.segment_objects_prefix(&t),
        "tributary/storage/topics/default/jobs/segments/"
    );
    assert_eq!(keys.objects_root(), "tributary/storage/topics/");
    assert_eq!(keys.owner_object(), "tributary/cluster-owner.json");
    assert_eq!(
        StorageKeys::segments_cur_value(1234),
        "00000000000000001234"
    );
    assert_eq!(
        StorageKeys::parse_segments_cur_value("00000000000000001234"),
        Ok(1234)
    );
    assert!(StorageKeys::parse_segments_cur_value("1234").is_err());
    // `cur` sorts after every padded descriptor.
    assert!(keys.segment_descriptor(&t, u64::MAX) < keys.segments_cur(&t));
}

#[test]
fn storage_keys_with_custom_prefix() {
    let keys = StorageKeys::new("/prod/trib").unwrap();
    let t = topic("/default/jobs");
    assert_eq!(
        keys.segment_descriptor(&t, 5),
        "/prod/trib/storage/topics/default/jobs/segments/00000000000000000005"
    );
    assert_eq!(
        keys.segment_object(&t, 5, 5),
        "prod/trib/storage/topics/default/jobs/segments/\
         00000000000000000005-00000000000000000005.seg"
    );
    // A key under another prefix is not ours.
    assert!(matches!(
        keys.parse(&StorageKeys::default().segments_cur(&t)),
        Err(KeyParseError::Unknown { .. })
    ));
}

#[test]
fn storage_prefix_validation() {
    let kind = |p: &str| StorageKeys::new(p).unwrap_err().kind;
    let part = NamePart::StoragePrefix;
    assert_eq!(
        kind("tributary"),
        NameErrorKind::MissingLeadingSlash { part }
    );
    assert_eq!(kind(""), NameErrorKind::MissingLeadingSlash { part });
    assert_eq!(kind("/"), NameErrorKind::Empty { part });
    // A trailing '/' or a '//' is named as such ("storage prefix is
    // empty" for /tributary/ sent an operator looking at the wrong thing).
    assert_eq!(kind("/tributary/"), NameErrorKind::EmptyComponent { part });
    assert_eq!(kind("/a//b"), NameErrorKind::EmptyComponent { part });
    assert_eq!(
        StorageKeys::new("/tributary/").unwrap_err().to_string(),
        "invalid storage prefix \"/tributary/\": storage prefix has an empty component (a trailing '/' or a '//'): write it without, like /tributary"
    );
    assert_eq!(kind("/a/../b"), NameErrorKind::DotName { part });
    assert_eq!(
        kind("/a b"),
        NameErrorKind::DisallowedChar {
            part,
            ch: ' ',
            at: 1
        }
    );
    assert!(matches!(
        kind(&format!("/{}", "p".repeat(255))),
        NameErrorKind::TooLong { len: 256, .. }
    ));
}

#[test]
#[should_panic(expected = "below start offset")]
fn segment_object_with_end_before_start_is_a_caller_bug() {
    let _ = StorageKeys::default().segment_object(&topic("/a/b"), 10, 9);
}

// ---- parsing ----------------------------------------------------------

#[test]
fn parse_reads_back_topics_and_subscriptions() {
    let t = topic("/default/jobs");
    let s = sub("worker-pool");
    assert_eq!(parse_topic(&topics::intent(&t)), Ok(t.clone()));
    assert_eq!(parse_topic(&topics::marker(&t)), Ok(t.clone()));
    assert_eq!(parse_topic(&edge::checkpoint(&t)), Ok(t.clone()));
    assert_eq!(parse_topic(&cluster::unassigned(&t)), Ok(t.clone()));
    assert_eq!(
        parse_topic(&cluster::broker_assignment(3, &t)),
        Ok(t.clone())
    );
    assert_eq!(parse_topic(&namespaces::topic(&t)), Ok(t.clone()));
    assert!(matches!(
        parse_topic(&cluster::leader()),
        Err(KeyParseError::Unknown { .. })
    ));
    assert_eq!(
        parse_subscription_key(&topics::subscription_cursor(&t, &s)),
        Ok((t.clone(), s.clone(), SubscriptionKey::Cursor))
    );
    assert!(matches!(
        parse_subscription_key(&topics::delivery(&t)),
        Err(KeyParseError::Unknown {
            expected: "subscription",
            ..
        })
    ));
    // A topic named like a sub-key is still the marker of that topic.
    assert_eq!(
        MetadataKey::parse("/topics/default/delivery"),
        Ok(MetadataKey::Topic {
            topic: topic("/default/delivery"),
            key: TopicKey::Marker
        })
    );
    // State vs assignment under a broker.
    assert_eq!(
        MetadataKey::parse("/cluster/brokers/3/state"),
        Ok(MetadataKey::BrokerState { broker_id: 3 })
    );
}

#[test]
fn parse_rejects_malformed_keys() {
    for key in [
        "",
        "cluster/leader",
        "/cluster/leader/",
        "/cluster",
        "/topics/default",
        "/topics/default/jobs/unknown",
        "/topics/default/jobs/subscriptions/s/cursor/x",
        "/topics/default/jobs/producers",
        "/schemas/_global/other",
        "/edge/checkpoints/default",
        "/nothing/here",
    ] {
        assert!(
            matches!(MetadataKey::parse(key), Err(KeyParseError::Unknown { .. })),
            "{key:?}"
        );
    }
    for (key, field) in [
        ("/cluster/register/01", "broker_id"),
        ("/cluster/register/+1", "broker_id"),
        ("/cluster/register/", "broker_id"),
        ("/cluster/load/18446744073709551616", "broker_id"),
        ("/topics/a/b/producers/x", "producer_id"),
        ("/schemas/_index/by_id/-1", "schema_id"),
        ("/cluster/rebalancing_history/17", "timestamp_ms"),
    ] {
        match MetadataKey::parse(key) {
            Err(KeyParseError::Number { field: f, .. }) => assert_eq!(f, field, "{key}"),
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(matches!(
        MetadataKey::parse("/topics/a b/c"),
        Err(KeyParseError::Name { .. })
    ));
    assert!(matches!(
        MetadataKey::parse("/topics/a/b/subscriptions/../cursor"),
        Err(KeyParseError::Name { .. })
    ));
    assert!(matches!(
        MetadataKey::parse("/schemas/_other/metadata"),
        Err(KeyParseError::Name { .. })
    ));
    assert_eq!(
        MetadataKey::parse("/namespaces/a/topics/b/t"),
        Err(KeyParseError::NamespaceMismatch {
            key: "/namespaces/a/topics/b/t".into(),
            outer: "a".into(),
            inner: "b".into()
        })
    );
}

#[test]
fn storage_parse_rejects_malformed_keys() {
    let keys = StorageKeys::default();
    for key in [
        "/tributary/storage/topics/a/b/segments/12",
        "/tributary/storage/topics/a/b/segments/1234567890123456789a",
        "/tributary/storage/topics/a/b/segments/99999999999999999999",
    ] {
        assert!(
            matches!(keys.parse(key), Err(KeyParseError::Number { .. })),
            "{key}"
        );
    }
    for key in [
        "/tributary/storage/topics/a/b",
        "/tributary/storage/topics/a/b/segments",
        "/tributary/storage/a/b/state",
        "/tributaryx/storage/topics/a/b/state",
        "tributary/storage/topics/a/b/state",
    ] {
        assert!(
            matches!(keys.parse(key), Err(KeyParseError::Unknown { .. })),
            "{key}"
        );
    }
    assert!(matches!(
        keys.parse_segment_descriptor(&keys.segments_cur(&topic("/a/b"))),
        Err(KeyParseError::Unknown { .. })
    ));
    let base = "tributary/storage/topics/a/b/segments/";
    assert_eq!(
        keys.parse_segment_object(&format!(
            "{base}00000000000000000010-00000000000000000009.seg"
        )),
        Err(KeyParseError::SegmentRange {
            key: format!("{base}00000000000000000010-00000000000000000009.seg"),
            start: 10,
            end: 9
        })
    );
    for file in [
        "00000000000000000010-00000000000000000019",
        "00000000000000000010.seg",
        "10-19.seg",
        "00000000000000000010-00000000000000000019.seg.tmp",
    ] {
        assert!(
            keys.parse_segment_object(&format!("{base}{file}")).is_err(),
            "{file}"
        );
    }
    // Object keys have no leading slash.
    assert!(
        keys.parse_segment_object(&format!(
            "/{base}00000000000000000010-00000000000000000019.seg"
        ))
        .is_err()
    );
}

// ---- property tests ---------------------------------------------------

fn name_part() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,24}".prop_filter("not . or ..", |s| s != "." && s != "..")
}

fn arb_topic() -> impl Strategy<Value = TopicName> {
    (name_part(), name_part()).prop_map(|(n, t)| topic(&format!("/{n}/{t}")))
}

fn arb_sub() -> impl Strategy<Value = SubscriptionName> {
    name_part().prop_map(|s| sub(&s))
}

fn arb_subject() -> impl Strategy<Value = SubjectName> {
    name_part()
        .prop_filter("not reserved", |s| !s.starts_with('_'))
        .prop_map(|s| SubjectName::new(&s).unwrap())
}

fn arb_topic_key() -> impl Strategy<Value = TopicKey> {
    let sub_key = prop_oneof![
        Just(SubscriptionKey::Metadata),
        Just(SubscriptionKey::Cursor),
        Just(SubscriptionKey::Acked),
        Just(SubscriptionKey::FailurePolicy),
        Just(SubscriptionKey::DispatchConfig),
    ];
    prop_oneof![
        Just(TopicKey::Marker),
        Just(TopicKey::Delivery),
        Just(TopicKey::Policy),
        Just(TopicKey::Intent),
        any::<u64>().prop_map(|producer_id| TopicKey::Producer { producer_id }),
        any::<u64>().prop_map(|first_offset| TopicKey::Hole { first_offset }),
        "([0-9a-f]{2}){1,200}".prop_map(|key_hex| TopicKey::Idempotency { key_hex }),
        (arb_sub(), sub_key).prop_map(|(name, key)| TopicKey::Subscription { name, key }),
    ]
}

fn arb_metadata_key() -> impl Strategy<Value = MetadataKey> {
    Union::new(vec![
        Just(MetadataKey::ClusterLeader).boxed(),
        Just(MetadataKey::ClusterId).boxed(),
        Just(MetadataKey::EdgeCluster).boxed(),
        any::<u64>()
            .prop_map(|broker_id| MetadataKey::BrokerRegistration { broker_id })
            .boxed(),
        any::<u64>()
            .prop_map(|broker_id| MetadataKey::BrokerState { broker_id })
            .boxed(),
        (any::<u64>(), arb_topic())
            .prop_map(|(broker_id, topic)| MetadataKey::BrokerAssignment { broker_id, topic })
            .boxed(),
        arb_topic()
            .prop_map(|topic| MetadataKey::Unassigned { topic })
            .boxed(),
        any::<u64>()
            .prop_map(|broker_id| MetadataKey::BrokerLoad { broker_id })
            .boxed(),
        Just(MetadataKey::LoadBalance).boxed(),
        any::<u64>()
            .prop_map(|timestamp_ms| MetadataKey::RebalancingHistory { timestamp_ms })
            .boxed(),
        name_part()
            .prop_map(|n| MetadataKey::NamespacePolicy {
                namespace: NamespaceName::new(&n).unwrap(),
            })
            .boxed(),
        arb_topic()
            .prop_map(|topic| MetadataKey::NamespaceTopic { topic })
            .boxed(),
        (arb_topic(), arb_topic_key())
            .prop_map(|(topic, key)| MetadataKey::Topic { topic, key })
            .boxed(),
        Just(MetadataKey::NextSchemaId).boxed(),
        arb_subject()
            .prop_map(|subject| MetadataKey::SchemaMetadata { subject })
            .boxed(),
        arb_subject()
            .prop_map(|subject| MetadataKey::SchemaCompatibility { subject })
            .boxed(),
        any::<u64>()
            .prop_map(|schema_id| MetadataKey::SchemaById { schema_id })
            .boxed(),
        name_part()
            .prop_map(|r| MetadataKey::AuthRole {
                role: RoleName::new(&r).unwrap(),
            })
            .boxed(),
        name_part()
            .prop_map(|p| MetadataKey::AuthPrincipal {
                principal: PrincipalName::new(&p).unwrap(),
            })
            .boxed(),
        name_part()
            .prop_map(|b| MetadataKey::AuthBinding {
                binding: BindingId::new(&b).unwrap(),
            })
            .boxed(),
        name_part()
            .prop_map(|e| MetadataKey::AuthEnrollment {
                edge: NamespaceName::new(&e).unwrap(),
            })
            .boxed(),
        name_part()
            .prop_map(|e| MetadataKey::AuthRevokedEdge {
                edge: NamespaceName::new(&e).unwrap(),
            })
            .boxed(),
        arb_topic()
            .prop_map(|topic| MetadataKey::EdgeCheckpoint { topic })
            .boxed(),
        arb_topic()
            .prop_map(|topic| MetadataKey::EdgeArchived { topic })
            .boxed(),
        (name_part(), any::<u64>())
            .prop_map(|(e, broker_id)| MetadataKey::FleetEdge {
                edge: NamespaceName::new(&e).unwrap(),
                broker_id,
            })
            .boxed(),
    ])
}

fn arb_storage_keys() -> impl Strategy<Value = StorageKeys> {
    proptest::collection::vec(name_part(), 1..4)
        .prop_map(|parts| StorageKeys::new(&format!("/{}", parts.join("/"))).unwrap())
}

proptest! {
    #[test]
    fn topic_name_round_trips(ns in name_part(), t in name_part()) {
        let name = format!("/{ns}/{t}");
        let parsed = TopicName::new(&name).unwrap();
        prop_assert_eq!(parsed.as_str(), name.as_str());
        prop_assert_eq!(parsed.namespace(), ns.as_str());
        prop_assert_eq!(parsed.topic(), t.as_str());
        let via_parts = TopicName::from_parts(&parsed.namespace_name(), &t).unwrap();
        prop_assert_eq!(via_parts, parsed);
    }

    #[test]
    fn metadata_key_round_trips(key in arb_metadata_key()) {
        let text = key.to_string();
        prop_assert_eq!(MetadataKey::parse(&text), Ok(key.clone()));
        if let Some(topic) = key.topic() {
            prop_assert_eq!(parse_topic(&text), Ok(topic.clone()));
        }
    }

    #[test]
    fn subscription_key_round_trips(
        t in arb_topic(),
        s in arb_sub(),
        kind in prop_oneof![
            Just(SubscriptionKey::Metadata),
            Just(SubscriptionKey::Cursor),
            Just(SubscriptionKey::Acked),
            Just(SubscriptionKey::FailurePolicy),
            Just(SubscriptionKey::DispatchConfig),
        ],
    ) {
        let text = match kind {
            SubscriptionKey::Metadata => topics::subscription(&t, &s),
            SubscriptionKey::Cursor => topics::subscription_cursor(&t, &s),
            SubscriptionKey::Acked => topics::subscription_acked(&t, &s),
            SubscriptionKey::FailurePolicy => topics::subscription_failure_policy(&t, &s),
            SubscriptionKey::DispatchConfig => topics::subscription_dispatch_config(&t, &s),
        };
        prop_assert!(text.starts_with(&topics::subscriptions_prefix(&t)));
        prop_assert_eq!(parse_subscription_key(&text), Ok((t, s, kind)));
    }

    #[test]
    fn storage_keys_round_trip(keys in arb_storage_keys(), t in arb_topic(), start in any::<u64>()) {
        let descriptor = keys.segment_descriptor(&t, start);
        prop_assert!(descriptor.starts_with(&keys.segments_prefix(&t)));
        prop_assert_eq!(keys.parse_segment_descriptor(&descriptor), Ok((t.clone(), start)));
        prop_assert_eq!(
            keys.parse(&keys.segments_cur(&t)),
            Ok(StorageKey::SegmentsCur { topic: t.clone() })
        );
        prop_assert_eq!(
            keys.parse(&keys.topic_state(&t)),
            Ok(StorageKey::TopicState { topic: t.clone() })
        );
        prop_assert!(keys.retired(&t).ends_with("/retired"));
        prop_assert_eq!(
            keys.parse(&keys.retired(&t)),
            Ok(StorageKey::Retired { topic: t.clone() })
        );
        let missing = keys.missing(&t, start);
        prop_assert!(missing.starts_with(&keys.missing_prefix(&t)));
        let suffix = format!("/missing/{start:020}");
        prop_assert!(missing.ends_with(&suffix));
        prop_assert_eq!(
            keys.parse(&missing),
            Ok(StorageKey::Missing { topic: t.clone(), start_offset: start })
        );
        prop_assert_eq!(
            keys.parse(&keys.lakehouse(&t)),
            Ok(StorageKey::Lakehouse { topic: t.clone() })
        );
        let file = keys.lakehouse_object(&t, "2006-12-16", start, start.saturating_add(9));
        prop_assert!(file.starts_with(&keys.lakehouse_objects_prefix(&t)));
        prop_assert!(!file.starts_with('/'));
        let name = format!("/date=2006-12-16/{start:020}-{:020}.parquet", start.saturating_add(9));
        prop_assert!(file.ends_with(&name));
        let rejected = keys.lakehouse_rejected_object(&t, start, start.saturating_add(9));
        let name = format!("/_rejected/{start:020}-{:020}.parquet", start.saturating_add(9));
        prop_assert!(rejected.ends_with(&name));
        let cur = StorageKeys::segments_cur_value(start);
        prop_assert_eq!(StorageKeys::parse_segments_cur_value(&cur), Ok(start));
        prop_assert!(descriptor.ends_with(&cur));
    }

    #[test]
    fn segment_object_round_trips(
        keys in arb_storage_keys(),
        t in arb_topic(),
        start in any::<u64>(),
        len in any::<u64>(),
    ) {
        let end = start.saturating_add(len);
        let object = keys.segment_object(&t, start, end);
        prop_assert!(!object.starts_with('/'));
        prop_assert!(object.starts_with(&keys.segment_objects_prefix(&t)));
        prop_assert!(object.starts_with(&keys.objects_root()));
        prop_assert_eq!(
            keys.parse_segment_object(&object),
            Ok(SegmentObject { topic: t, start_offset: start, end_offset: end })
        );
    }

    #[test]
    fn padded_keys_sort_numerically(a in any::<u64>(), b in any::<u64>(), t in arb_topic()) {
        let keys = StorageKeys::default();
        prop_assert_eq!(
            keys.segment_descriptor(&t, a).cmp(&keys.segment_descriptor(&t, b)),
            a.cmp(&b)
        );
        prop_assert_eq!(
            cluster::rebalancing_history(a).cmp(&cluster::rebalancing_history(b)),
            a.cmp(&b)
        );
    }

    #[test]
    fn partition_round_trips(t in arb_topic(), n in any::<u32>()) {
        let p = t.partition(n).unwrap();
        prop_assert_eq!(p.partition_of(), Some((t, n)));
    }

    #[test]
    fn parsers_never_panic(s in "(/[a-z_0-9.é -]{0,12}){0,8}", raw in ".{0,64}") {
        for input in [&s, &raw] {
            let _ = TopicName::new(input);
            let _ = MetadataKey::parse(input);
            let _ = StorageKeys::default().parse(input);
            let _ = StorageKeys::default().parse_segment_object(input);
            if let Ok(t) = TopicName::new(input) {
                prop_assert_eq!(t.as_str(), input.as_str());
            }
            if let Ok(key) = MetadataKey::parse(input) {
                prop_assert_eq!(key.to_string(), input.as_str());
            }
        }
    }
}

#[test]
fn missing_marks_parse_and_bad_ones_are_refused() {
    let keys = StorageKeys::default();
    let t = topic("/plant1/events");
    let key = "/tributary/storage/topics/plant1/events/missing/00000000000000001000";
    assert_eq!(keys.missing(&t, 1000), key);
    assert_eq!(
        keys.parse(key),
        Ok(StorageKey::Missing {
            topic: t.clone(),
            start_offset: 1000
        })
    );
    assert!(key.starts_with(&keys.missing_prefix(&t)));
    for bad in [
        "/tributary/storage/topics/plant1/events/missing/1000",
        "/tributary/storage/topics/plant1/events/missing/",
        "/tributary/storage/topics/plant1/events/missing/0000000000000000100x",
    ] {
        assert!(keys.parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn no_edge_may_take_a_name_a_broker_certificate_could_have() {
    for name in [
        "broker-2",
        "broker-x",
        "Broker-3",
        "BROKER-",
        "tributary-broker",
        "Tributary-Broker",
        "_system",
        "default",
    ] {
        assert!(reserved_edge_id(name).is_some(), "{name}");
        assert!(new_edge_id_problem(name).is_some(), "{name}");
    }
    for name in [
        "plant1",
        "mybroker-2",
        "broker",
        "brokers",
        "tributary-broker2",
    ] {
        assert_eq!(reserved_edge_id(name), None, "{name}");
    }
    assert!(is_broker_identity("broker-1"));
    assert!(!is_broker_identity("plant1"));
}
