use super::*;

fn broker(node_id: u64) -> Owner {
    Owner::Broker { node_id }
}

fn edge(edge_id: &str) -> Owner {
    Owner::EdgeAgent {
        edge_id: edge_id.to_owned(),
    }
}

#[test]
fn both_owners_round_trip_and_the_bytes_are_the_documented_ones() {
    assert_eq!(
        String::from_utf8(broker(3).encode()).unwrap(),
        "{\n  \"format_version\": 1,\n  \"component\": \"broker\",\n  \"node_id\": 3\n}\n"
    );
    assert_eq!(
        String::from_utf8(edge("plant1").encode()).unwrap(),
        "{\n  \"format_version\": 1,\n  \"component\": \"edge-agent\",\n  \"edge_id\": \"plant1\"\n}\n"
    );
    for owner in [broker(1), broker(u64::MAX), edge("plant1"), edge("a.b-c_d")] {
        assert_eq!(Owner::decode(&owner.encode()), Ok(owner));
    }
    // Written by hand: one line, other key order.
    assert_eq!(
        Owner::decode(br#"{"node_id":7,"component":"broker","format_version":1}"#),
        Ok(broker(7))
    );
}

#[test]
fn garbled_files_are_errors_that_say_what_is_wrong() {
    let invalid = |bytes: &[u8]| match Owner::decode(bytes) {
        Err(DecodeError::Invalid(why)) => why,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
    };
    let json = |bytes: &[u8]| {
        assert!(
            matches!(Owner::decode(bytes), Err(DecodeError::Json(_))),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    };
    json(b"");
    json(b"\0\0\0\0");
    json(b"{\"format_version\":1,\"component\":\"broker\",\"node_id\":3");
    json(b"[1]");
    json(b"{\"component\":\"broker\",\"node_id\":3}");
    json(b"{\"format_version\":-1,\"component\":\"broker\",\"node_id\":3}");
    json(b"{\"format_version\":1,\"component\":\"broker\",\"node_id\":\"3\"}");
    json(b"{\"format_version\":1,\"component\":\"broker\",\"node_id\":3,\"extra\":1}");
    json(b"{\"format_version\":1,\"node_id\":3}");
    assert_eq!(
        Owner::decode(b"{\"format_version\":2,\"anything\":\"new\"}"),
        Err(DecodeError::NewerFormat { found: 2 })
    );
    assert_eq!(
        invalid(b"{\"format_version\":0,\"component\":\"broker\",\"node_id\":3}"),
        "format_version 0 does not exist"
    );
    assert_eq!(
        invalid(b"{\"format_version\":1,\"component\":\"tier-service\"}"),
        "unknown component \"tier-service\" (expected \"broker\" or \"edge-agent\")"
    );
    for bad in [
        &br#"{"format_version":1,"component":"broker"}"#[..],
        br#"{"format_version":1,"component":"broker","node_id":0}"#,
        br#"{"format_version":1,"component":"broker","node_id":1,"edge_id":"x"}"#,
    ] {
        assert_eq!(
            invalid(bad),
            "a broker's file needs node_id (>= 1) and no edge_id"
        );
    }
    for bad in [
        &br#"{"format_version":1,"component":"edge-agent"}"#[..],
        br#"{"format_version":1,"component":"edge-agent","edge_id":""}"#,
        br#"{"format_version":1,"component":"edge-agent","edge_id":"x","node_id":1}"#,
    ] {
        assert_eq!(
            invalid(bad),
            "an edge agent's file needs a non-empty edge_id and no node_id"
        );
    }
}

#[test]
fn a_fresh_directory_is_claimed_and_then_matches() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    assert_eq!(inspect(&data, &broker(1)).unwrap(), Found::Fresh);
    assert!(!data.exists(), "inspect changes nothing");
    assert_eq!(claim(&data, &broker(1)).unwrap(), Found::Fresh);
    assert_eq!(
        std::fs::read(data.join(IDENTITY_FILE)).unwrap(),
        broker(1).encode()
    );
    assert!(!data.join("identity.json.tmp").exists());
    assert_eq!(claim(&data, &broker(1)).unwrap(), Found::Matches);
    assert_eq!(inspect(&data, &broker(1)).unwrap(), Found::Matches);
}

#[test]
fn another_identity_or_component_is_refused_naming_both_and_the_file_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(IDENTITY_FILE);
    claim(dir.path(), &broker(1)).unwrap();
    let err = claim(dir.path(), &broker(2)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: this data directory belongs to broker node_id 1, but the configuration is \
             broker node_id 2: its Raft state is node 1's and another node must not run on it; \
             refusing to start. Set node_id = 1 back, or give this node its own empty data_dir",
            path.display()
        )
    );
    let err = inspect(dir.path(), &edge("plant1")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: this data directory belongs to broker node_id 1, but the configuration is \
             edge-agent edge_id \"plant1\", another component; refusing to start. Point \
             data_dir at this edge-agent's own directory",
            path.display()
        )
    );
    assert_eq!(std::fs::read(&path).unwrap(), broker(1).encode());

    let other = tempfile::tempdir().unwrap();
    claim(other.path(), &edge("plant1")).unwrap();
    let err = claim(other.path(), &edge("plant2")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{file}: this data directory belongs to edge-agent edge_id \"plant1\", but the \
             configuration is edge-agent edge_id \"plant2\": the records under \
             {dir}/topics/plant1 not yet replicated would never be sent; refusing to start. Set \
             edge_id = \"plant1\" back and let the backlog drain, then move {dir} aside to start \
             under the new edge_id",
            file = other.path().join(IDENTITY_FILE).display(),
            dir = other.path().display()
        )
    );
}

#[test]
fn a_garbled_file_is_refused_and_never_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(IDENTITY_FILE);
    for garbage in [&b"{\"format_version\":1,"[..], b"", &[b'x'; 5000]] {
        std::fs::write(&path, garbage).unwrap();
        let err = claim(dir.path(), &broker(1)).unwrap_err();
        assert!(matches!(err, IdentityError::Garbled { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("{}: not an identity file: ", path.display())),
            "{text}"
        );
        assert!(
            text.ends_with(
                "; refusing to start and leaving the file as it is. If it was damaged, restore \
                 it (the format is in FORMAT.md, \"Data directory identity\"), or remove it to \
                 have it written from this configuration (broker node_id 1) at the next start"
            ),
            "{text}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), garbage);
    }
}

#[test]
fn a_directory_from_before_identity_files_is_adopted_by_its_own_component_only() {
    // A broker's: Raft state, topic WALs of several namespaces.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("raft")).unwrap();
    std::fs::write(dir.path().join("raft/raft.redb"), b"db").unwrap();
    std::fs::create_dir_all(dir.path().join("topics/a/t")).unwrap();
    std::fs::create_dir_all(dir.path().join("topics/b/t")).unwrap();
    let err = inspect(dir.path(), &edge("a")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{dir} has no identity.json but holds {dir}/raft, so it is a broker's data \
             directory: refusing to start edge-agent edge_id \"a\" on it. Point data_dir at \
             this edge-agent's own directory",
            dir = dir.path().display()
        )
    );
    assert_eq!(inspect(dir.path(), &broker(2)).unwrap(), Found::Adopted);
    assert_eq!(claim(dir.path(), &broker(2)).unwrap(), Found::Adopted);
    assert_eq!(inspect(dir.path(), &broker(2)).unwrap(), Found::Matches);

    // An edge's: its metadata store, its namespace's WALs.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("metadata.redb"), b"db").unwrap();
    let err = inspect(dir.path(), &broker(1)).unwrap_err();
    assert!(matches!(err, IdentityError::ForeignLayout { .. }), "{err}");
    std::fs::create_dir_all(dir.path().join("topics/plant1/events")).unwrap();
    // An empty namespace directory is not a backlog.
    std::fs::create_dir_all(dir.path().join("topics/empty")).unwrap();
    assert_eq!(claim(dir.path(), &edge("plant1")).unwrap(), Found::Adopted);

    // Only WALs, no store (lost or deleted): still this component's data.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("topics/plant1/events")).unwrap();
    assert_eq!(
        inspect(dir.path(), &edge("plant1")).unwrap(),
        Found::Adopted
    );
    // An empty directory (made by a package) is fresh.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        inspect(empty.path(), &edge("plant1")).unwrap(),
        Found::Fresh
    );
}

#[test]
fn an_edge_directory_from_before_identity_files_with_another_namespace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("metadata.redb"), b"db").unwrap();
    std::fs::create_dir_all(dir.path().join("topics/plant1/events")).unwrap();
    std::fs::create_dir_all(dir.path().join("topics/plant2/events")).unwrap();
    let err = claim(dir.path(), &edge("plant2")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{dir} has no identity.json and holds the topics of namespace(s) plant1 (under \
             {dir}/topics), not of edge_id \"plant2\": edge_id was changed, and their records \
             not yet replicated would never be sent; refusing to start. Set edge_id back to the \
             old value and let the backlog drain, then move {dir} aside to start under a new \
             edge_id",
            dir = dir.path().display()
        )
    );
    assert!(!dir.path().join(IDENTITY_FILE).exists());
}
