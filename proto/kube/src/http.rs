//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::error::{Error, Result};

/// Metrics a process exposes on `/metrics`.
pub trait Exposition: Send + Sync {
    /// The metrics in the Prometheus text format.
    fn encode(&self) -> String;
}

/// What the HTTP endpoints report on.
#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<dyn Exposition>,
    /// Set once every controller is running and the API server answered.
    pub ready: Arc<AtomicBool>,
}

/// Serves the endpoints until `shutdown` completes.
pub async fn serve(
    address: SocketAddr,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::ServeHttp {
            address: address.to_string(),
            source,
        })?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::ServeHttp {
            address: address.to_string(),
            source,
        })
}

async fn metrics(State(health): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics.encode(),
    )
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}
