//! A broker router served in this process on 127.0.0.1 over a fresh redb
//! metadata store, and raw HTTP calls to it that return any status with
//! its JSON body: the harness of the API tests that need no broker
//! process (`auth_api`, `auth_races`, `enroll_api`, `central_idempotency`,
//! `dead_letter_scope`, `topic_delete`).

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use broker_core::clock::SystemClock;
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;
use serde_json::Value;
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::auth::AuthState;
use tributary_broker::consumer::{ConsumerConfig, ConsumerService};
use tributary_broker::replication::topics::TopicStore;
use tributary_proto::Limits;

/// The served router, its store and runtime.
pub struct Served {
    /// Runs the server; tests block on store calls with it.
    pub runtime: tokio::runtime::Runtime,
    /// The metadata store the router was built on.
    pub store: Arc<RedbStore>,
    /// `http://127.0.0.1:{port}`.
    pub base: String,
    /// No status is an error; no connection is reused.
    pub raw: ureq::Agent,
    _dir: tempfile::TempDir,
}

/// A status and its body (JSON, else the text as a JSON string).
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Served {
    /// Opens a redb store in a temporary directory and serves the router
    /// `app` builds from it (called inside the runtime, so it may spawn
    /// tasks; the directory is given for other files, such as topic WALs).
    pub fn start(app: impl FnOnce(Arc<RedbStore>, &Path) -> axum::Router) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        runtime.block_on(async {
            let app = app(store.clone(), dir.path());
            tokio::spawn(async move { axum::serve(listener, app).await });
        });
        let raw = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .build()
            .into();
        Served {
            runtime,
            store,
            base,
            raw,
            _dir: dir,
        }
    }

    /// The admin and consumer routers (token `token`, a single-node
    /// cluster view) on a fresh store, topic WALs in its directory, the
    /// consumer service with `config` and its ticker running.
    pub fn consumers(token: &str, config: ConsumerConfig) -> Served {
        Served::start(|store, dir| {
            let state = AdminState {
                store: store.clone(),
                cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
                auth: AuthState::new(store.clone(), Some(token.to_owned())),
            };
            let store_dyn: Arc<dyn MetadataStore> = store.clone();
            let topics = Arc::new(TopicStore::new(
                dir.join("topics"),
                store_dyn.clone(),
                Limits::default(),
            ));
            let service = ConsumerService::new(
                topics,
                store_dyn,
                config,
                "127.0.0.1:7400".to_owned(),
                1,
                Arc::new(SystemClock),
            );
            service.spawn_ticker();
            router(state.clone()).merge(tributary_broker::consumer::http::router(
                service,
                state.auth.clone(),
            ))
        })
    }

    /// `method path` with `Authorization: Bearer token` if given and a
    /// JSON `body` if given.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Reply {
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            builder = builder.header("Content-Type", "application/json");
        }
        let response = match body {
            Some(body) => self.raw.run(builder.body(body.to_owned()).unwrap()),
            None => self.raw.run(builder.body(()).unwrap()),
        }
        .unwrap();
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Reply { status, body }
    }

    /// The stored value of `key`.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.runtime.block_on(self.store.get(key)).unwrap()
    }
}
