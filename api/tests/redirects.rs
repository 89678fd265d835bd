//! [`HttpClient`] follows `307`/`308` itself: two real listeners on
//! 127.0.0.1 (a "non-owner" that redirects, an "owner" that answers), each
//! a minimal HTTP/1.1 server on a thread that records what it received.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tributary_api::client::{ClientError, HttpClient, MAX_REDIRECTS};

/// One request as a server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    authorization: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// Serves `answer(request)` → (status line, extra headers, body) on a new
/// listener; returns its base URL and what it saw.
fn serve(
    answer: impl Fn(&Seen) -> (String, Vec<(String, String)>, String) + Send + 'static,
) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let method = parts.next().unwrap_or_default().to_owned();
            let target = parts.next().unwrap_or_default().to_owned();
            let (mut authorization, mut content_type, mut length) = (None, None, 0usize);
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                    break;
                }
                let (name, value) = header.split_once(':').unwrap_or((&header, ""));
                let value = value.trim().to_owned();
                match name.to_ascii_lowercase().as_str() {
                    "authorization" => authorization = Some(value),
                    "content-type" => content_type = Some(value),
                    "content-length" => length = value.parse().unwrap_or(0),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let request = Seen {
                method,
                target,
                authorization,
                content_type,
                body,
            };
            let (status, headers, body) = answer(&request);
            log.lock().unwrap().push(request);
            let mut response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(&body);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (base, seen)
}

fn client(base: &str) -> HttpClient {
    HttpClient::new(base, Some("secret-token"), Duration::from_secs(10))
}

#[test]
fn a_post_is_re_sent_to_the_owner_with_body_and_token() {
    let (owner, owner_seen) = serve(|_| {
        (
            "200 OK".into(),
            vec![],
            json!({"base_offset": 7, "next_offset": 9}).to_string(),
        )
    });
    let location = owner.clone();
    let (non_owner, non_owner_seen) = serve(move |r| {
        (
            "307 Temporary Redirect".into(),
            vec![("Location".into(), format!("{location}{}", r.target))],
            json!({"error": "topic /a/b is owned by broker 2 (epoch 5)", "kind": "not_owner", "owner": 2, "epoch": 5}).to_string(),
        )
    });
    let body = json!({"records": [{"value": "x"}, {"value": "y"}]});
    let reply: Value = client(&non_owner)
        .post("/v1/topics/a/b/records", &body)
        .expect("publish through the non-owner");
    assert_eq!(reply, json!({"base_offset": 7, "next_offset": 9}));
    let first = non_owner_seen.lock().unwrap().clone();
    let second = owner_seen.lock().unwrap().clone();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(second.len(), 1, "{second:?}");
    let hop = &second[0];
    assert_eq!(hop.method, "POST");
    assert_eq!(hop.target, "/v1/topics/a/b/records");
    assert_eq!(hop.authorization.as_deref(), Some("Bearer secret-token"));
    assert_eq!(hop.content_type.as_deref(), Some("application/json"));
    assert_eq!(hop.body, serde_json::to_vec(&body).unwrap());
    assert_eq!(hop.body, first[0].body);
}

#[test]
fn a_get_keeps_its_query_and_relative_locations_resolve() {
    let (owner, owner_seen) = serve(|_| ("200 OK".into(), vec![], json!({"ok": true}).to_string()));
    let owner_for_hop = owner.clone();
    // 308 to a path on the same listener first, then 307 to the owner.
    let (non_owner, non_owner_seen) = serve(move |r| {
        if r.target.starts_with("/old") {
            let rest = r.target.trim_start_matches("/old");
            (
                "308 Permanent Redirect".into(),
                vec![("Location".into(), rest.to_owned())],
                "{}".into(),
            )
        } else {
            (
                "307 Temporary Redirect".into(),
                vec![("Location".into(), format!("{owner_for_hop}{}", r.target))],
                "{}".into(),
            )
        }
    });
    let reply: Value = client(&non_owner)
        .get(
            "/old/v1/topics/a/b/records",
            &[("offset", "3"), ("max_messages", "2")],
        )
        .expect("peek through two redirects");
    assert_eq!(reply, json!({"ok": true}));
    let first = non_owner_seen.lock().unwrap().clone();
    assert_eq!(first.len(), 2);
    assert_eq!(
        first[0].target,
        "/old/v1/topics/a/b/records?offset=3&max_messages=2"
    );
    assert_eq!(
        first[1].target,
        "/v1/topics/a/b/records?offset=3&max_messages=2"
    );
    assert_eq!(
        first[1].authorization.as_deref(),
        Some("Bearer secret-token")
    );
    let hop = &owner_seen.lock().unwrap()[0];
    assert_eq!(hop.method, "GET");
    assert_eq!(hop.target, "/v1/topics/a/b/records?offset=3&max_messages=2");
    assert_eq!(hop.authorization.as_deref(), Some("Bearer secret-token"));
}

#[test]
fn a_redirect_loop_stops_after_the_hop_limit() {
    let (looping, seen) = serve(|r| {
        (
            "307 Temporary Redirect".into(),
            vec![("Location".into(), r.target.clone())],
            "{}".into(),
        )
    });
    let err = client(&looping)
        .delete::<Value>("/v1/topics/a/b/subscriptions/s")
        .expect_err("a loop is refused");
    assert!(matches!(err, ClientError::Redirect { .. }), "{err:?}");
    assert!(err.to_string().contains("more than 5 redirects"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), MAX_REDIRECTS + 1);
}

#[test]
fn a_redirect_without_location_is_the_error_it_carries() {
    // No Location: the response is answered as is (a 307 below 400 whose
    // body is the JSON).
    let (server, _) = serve(|_| {
        (
            "307 Temporary Redirect".into(),
            vec![],
            json!({"x": 1}).to_string(),
        )
    });
    let reply: Value = client(&server).get("/v1/x", &[]).expect("answered as is");
    assert_eq!(reply, json!({"x": 1}));
    // A Location that is not a URL or an absolute path is refused.
    let (bad, _) = serve(|_| {
        (
            "307 Temporary Redirect".into(),
            vec![("Location".into(), "ftp://elsewhere/x".into())],
            "{}".into(),
        )
    });
    let err = client(&bad)
        .get::<Value>("/v1/x", &[])
        .expect_err("refused");
    assert!(matches!(err, ClientError::Redirect { .. }), "{err:?}");
}
