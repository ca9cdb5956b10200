//! `norepeat_gateway_shadow_total{route,would}`, from the library's own
//! shadow line.
//!
//! A layer in shadow mode counts `norepeat_shadow_total{guard,would}`
//! (no route) and logs one `info` event with the route it was given,
//! which the gateway sets to the route's `match`. This tracing layer
//! reads that event and counts it by route, so the gateway's metric is
//! labelled by template as the contract asks, with no change to the
//! library.

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The message of the library's shadow event.
const SHADOW_MESSAGE: &str = "shadow mode: would refuse; let through";

/// Counts each shadow decision in `norepeat_gateway_shadow_total`.
///
/// ```
/// use tracing_subscriber::prelude::*;
/// let _guard = tracing_subscriber::registry()
///     .with(norepeat_gateway::serve::ShadowCounter)
///     .set_default();
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ShadowCounter;

#[derive(Default)]
struct Fields {
    shadow: bool,
    route: String,
    would: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "route" => value.clone_into(&mut self.route),
            "would" => value.clone_into(&mut self.would),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.shadow = format!("{value:?}") == SHADOW_MESSAGE;
        }
    }
}

impl<S: Subscriber> Layer<S> for ShadowCounter {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("norepeat") {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.shadow {
            metrics::counter!(
                "norepeat_gateway_shadow_total",
                "route" => fields.route,
                "would" => fields.would,
            )
            .increment(1);
        }
    }
}
