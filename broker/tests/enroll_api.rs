//! Enrollment over real HTTP on 127.0.0.1 (the admin router, with its
//! token route, and `POST /v1/enroll` signing with a development CA, in
//! one process over a redb store): no edge may be given an id a broker's
//! certificate could have (`broker-…`, `tributary-broker`), neither when a
//! token is minted nor when a token stored for one is presented.

mod served;

use std::sync::Arc;

use broker_core::metadata::MetadataStore;
use serde_json::{Value, json};
use served::{Reply, Served};
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::auth::model::sha256_hex;
use tributary_broker::enroll::model::StoredEnrollment;
use tributary_broker::enroll::{EnrollConfig, EnrollService, Signer, enroll_router};
use tributary_proto::keys::{NamespaceName, auth};

const BOOTSTRAP: &str = "enroll-test-bootstrap-token";

/// The admin and enrollment routers over one store, signing with a
/// development CA.
struct Harness(Served);

impl std::ops::Deref for Harness {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Harness {
    fn start() -> Harness {
        Harness(Served::start(|store, dir| {
            let certs = dir.join("certs");
            broker_core::dev_certs::issue(&certs, &[1], &[]).unwrap();
            let config = EnrollConfig {
                ca_cert: certs.join("ca.pem"),
                ca_key: broker_core::dev_certs::ca_key_path(&certs),
                cert_validity_days: 30,
            };
            let signer = Arc::new(Signer::load(&config, &config.ca_cert).unwrap());
            let store_dyn: Arc<dyn MetadataStore> = store;
            let state = AdminState::with_bootstrap_token(
                store_dyn.clone(),
                Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
                BOOTSTRAP,
            );
            let service = EnrollService::new(store_dyn, state.auth.clone(), Some(signer));
            router(state).merge(enroll_router(service))
        }))
    }

    fn post(&self, path: &str, token: &str, body: Option<Value>) -> Reply {
        let body = body.map(|b| b.to_string());
        self.request("POST", path, Some(token), body.as_deref())
    }

    /// Stores an unused enrollment token for `edge` directly (as one
    /// minted before ids were checked, or written around the API would
    /// be) and returns it.
    fn store_token(&self, edge: &str) -> String {
        let token = format!("trib-enroll.{edge}.{}", "ab".repeat(32));
        let stored = StoredEnrollment {
            edge_id: edge.to_owned(),
            token_sha256: sha256_hex(token.as_bytes()),
            created_at_ms: 1,
            created_by: "test".to_owned(),
            expires_at_ms: u64::MAX / 2,
            used_at_ms: None,
            serial: None,
        };
        let key = auth::enrollment(&NamespaceName::new(edge).unwrap());
        self.runtime
            .block_on(self.store.put(&key, serde_json::to_value(stored).unwrap()))
            .unwrap();
        token
    }
}

fn csr() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    rcgen::CertificateParams::new(vec!["device".to_owned()])
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap()
}

#[test]
fn no_token_is_minted_for_an_edge_id_a_broker_certificate_could_have() {
    let h = Harness::start();
    for edge in ["broker-2", "broker-x", "Broker-3", "tributary-broker"] {
        let reply = h.post(&format!("/v1/edges/{edge}/token"), BOOTSTRAP, None);
        assert_eq!(reply.status, 400, "{edge}: {}", reply.body);
        assert_eq!(reply.body["kind"], "invalid_input", "{}", reply.body);
        assert_eq!(reply.body["field"], "edge_id", "{}", reply.body);
        let error = reply.body["error"].as_str().unwrap();
        assert!(error.contains(&format!("{edge:?}")), "{error}");
        assert!(error.contains("broker"), "{error}");
        let key = auth::enrollment(&NamespaceName::new(edge).unwrap());
        assert_eq!(h.get(&key), None, "{edge}: a token was stored");
    }
    // An ordinary edge id, and one that merely contains "broker", still
    // get tokens.
    for edge in ["plant1", "mybroker-2"] {
        let reply = h.post(&format!("/v1/edges/{edge}/token"), BOOTSTRAP, None);
        assert_eq!(reply.status, 201, "{edge}: {}", reply.body);
    }
}

#[test]
fn a_token_stored_for_a_broker_identity_signs_no_certificate() {
    let h = Harness::start();
    for edge in ["broker-2", "tributary-broker"] {
        let token = h.store_token(edge);
        let key = auth::enrollment(&NamespaceName::new(edge).unwrap());
        let before = h.get(&key);
        let reply = h.post("/v1/enroll", &token, Some(json!({"csr": csr()})));
        assert_eq!(reply.status, 403, "{edge}: {}", reply.body);
        assert_eq!(reply.body["kind"], "edge_id_reserved", "{}", reply.body);
        assert_eq!(reply.body["field"], "edge_id", "{}", reply.body);
        assert!(reply.body.get("certificate").is_none(), "{}", reply.body);
        // The token is left as it was (not consumed).
        assert_eq!(h.get(&key), before);
    }
    // The same path signs for an ordinary edge.
    let token = h.store_token("plant1");
    let reply = h.post("/v1/enroll", &token, Some(json!({"csr": csr()})));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["edge_id"], "plant1");
    assert!(
        reply.body["certificate"]
            .as_str()
            .unwrap()
            .contains("CERTIFICATE")
    );
}
