//! The HTTPS listener on a real socket: who may connect (a client that
//! trusts the cluster CA; with or without a client certificate of that CA)
//! and who may not (a client of another CA; a client certificate of another
//! CA), and the `PeerCertificate` a verified client certificate becomes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use broker_core::dev_certs;
use broker_core::tls::TlsIdentity;
use tributary_api::client::{ClientTls, HttpClient};

use super::serve_https;
use crate::http::PeerCertificate;

/// Answers `{"identity": ...}`: the request's `PeerCertificate`, or null.
fn echo_router() -> axum::Router {
    axum::Router::new().route(
        "/whoami",
        get(|request: axum::extract::Request| async move {
            let identity = request
                .extensions()
                .get::<PeerCertificate>()
                .map(|peer| peer.identity.clone());
            axum::Json(serde_json::json!({ "identity": identity }))
        }),
    )
}

fn tls(dir: &Path, client: Option<&str>) -> ClientTls {
    ClientTls {
        ca: dir.join("ca.pem"),
        client_cert: client.map(|edge| {
            let paths = dev_certs::edge_paths(dir, edge);
            (paths.cert, paths.key)
        }),
    }
}

/// `GET /whoami` from a blocking client with `tls`.
async fn whoami(base: String, tls: ClientTls) -> Result<serde_json::Value, String> {
    tokio::task::spawn_blocking(move || {
        let client = HttpClient::with_tls(&base, None, Duration::from_secs(10), &tls)
            .map_err(|e| e.to_string())?;
        client
            .get::<serde_json::Value>("/whoami", &[])
            .map_err(|e| e.to_string())
    })
    .await
    .expect("client task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_the_cluster_ca_connect_and_their_certificates_become_peer_identities() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    let other = dir.path().join("other");
    dev_certs::issue(&cluster, &[1], &["tier-1".into()]).unwrap();
    dev_certs::issue(&other, &[1], &["tier-1".into()]).unwrap();
    let identity = TlsIdentity::load(&dev_certs::broker_paths(&cluster, 1)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_https(
        listener,
        Arc::new(identity.https_server().unwrap()),
        echo_router(),
        async {
            let _ = stopped.await;
        },
    ));

    // A slow client that never sends its ClientHello does not hold up the
    // accept loop: the others below are served while it sits there.
    let idle = tokio::net::TcpStream::connect(base.trim_start_matches("https://"))
        .await
        .unwrap();

    let anonymous = whoami(base.clone(), tls(&cluster, None)).await;
    assert_eq!(anonymous, Ok(serde_json::json!({ "identity": null })));
    let with_cert = whoami(base.clone(), tls(&cluster, Some("tier-1"))).await;
    assert_eq!(with_cert, Ok(serde_json::json!({ "identity": "tier-1" })));

    // A client that trusts another CA refuses the broker's certificate.
    let err = whoami(base.clone(), tls(&other, None)).await.unwrap_err();
    assert!(err.contains("cannot reach"), "{err}");
    // (The other dev CA has the same name: the signature does not verify.)
    assert!(err.contains("invalid peer certificate"), "{err}");
    // The error says what is likely wrong: it named the TLS symptom only.
    assert!(
        err.contains("the CA given did not sign the server's certificate"),
        "{err}"
    );
    // `http://` against the HTTPS listener: named as the wrong scheme (it
    // read "http parse fail: invalid HTTP version").
    let plain_base = base.replace("https://", "http://");
    let err = tokio::task::spawn_blocking(move || {
        HttpClient::new(&plain_base, None, Duration::from_secs(10))
            .get::<serde_json::Value>("/whoami", &[])
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(err.contains("if it serves HTTPS, use https://"), "{err}");
    // `https://` against a plain HTTP listener: the other way round (it
    // read "received corrupt message of type InvalidContentType").
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_url = format!("https://{}", plain.local_addr().unwrap());
    let plain_server = tokio::spawn(async move { axum::serve(plain, echo_router()).await });
    let err = whoami(plain_url, tls(&cluster, None)).await.unwrap_err();
    assert!(
        err.contains("if it serves plain HTTP, use http://"),
        "{err}"
    );
    plain_server.abort();
    // A client certificate of another CA is refused by the broker.
    let mut foreign = tls(&cluster, None);
    let foreign_paths = dev_certs::edge_paths(&other, "tier-1");
    foreign.client_cert = Some((foreign_paths.cert, foreign_paths.key));
    let err = whoami(base.clone(), foreign).await.unwrap_err();
    assert!(err.contains("cannot reach"), "{err}");

    drop(idle);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the listener stops after its drain")
        .unwrap()
        .unwrap();
}

/// A client that completed its handshake but sends a request's headers
/// only in part, or nothing at all, is disconnected after the header read
/// timeout (it held the connection for ever: slowloris); a client that
/// sends a whole request within it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_headers_and_idle_connections_are_closed_after_the_header_timeout() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    dev_certs::issue(&cluster, &[1], &[]).unwrap();
    let identity = TlsIdentity::load(&dev_certs::broker_paths(&cluster, 1)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let timeout = Duration::from_millis(500);
    let server = tokio::spawn(super::serve_https_with(
        listener,
        Arc::new(identity.https_server().unwrap()),
        echo_router(),
        async {
            let _ = stopped.await;
        },
        timeout,
    ));
    let mut client = broker_core::tls::https_client_config(&cluster.join("ca.pem"), None).unwrap();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let connect = async || {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name =
            rustls::pki_types::ServerName::try_from(broker_core::tls::BROKER_SERVER_NAME).unwrap();
        connector.connect(name, tcp).await.unwrap()
    };
    for sent in [&b"GET /whoami HTTP/1.1\r\nHost: broker\r\n"[..], &b""[..]] {
        let mut stream = connect().await;
        stream.write_all(sent).await.unwrap();
        stream.flush().await.unwrap();
        let started = tokio::time::Instant::now();
        let mut buf = Vec::new();
        // The server closes (EOF, or a reset); nothing is answered.
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{sent:?}: the connection was not closed within 10 s"));
        let _ = read;
        assert!(
            buf.is_empty() || String::from_utf8_lossy(&buf).contains("408"),
            "{buf:?}"
        );
        assert!(started.elapsed() >= timeout / 2, "closed too early");
    }
    // A whole request is answered.
    let mut stream = connect().await;
    stream
        .write_all(b"GET /whoami HTTP/1.1\r\nHost: broker\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
