//! The plumbing of an owned Prometheus registry: a metric is made and
//! registered in one call, and the registry encodes as the text exposition.
//! Which metrics there are is `metrics.rs`'s to say (this module is below it).

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Makes metrics registered in `.0`. A name registered twice, or a metric
/// that is not valid, is a programming error: it panics.
pub struct Registrar<'a>(pub &'a Registry);

impl Registrar<'_> {
    /// Registers `made` (a metric just made) and returns it.
    pub fn add<C: Collector + Clone + 'static>(&self, made: prometheus::Result<C>) -> C {
        let c = made.expect("valid metric");
        self.collector(c.clone());
        c
    }

    /// Registers a collector that is not kept (it is only gathered).
    pub fn collector(&self, c: impl Collector + 'static) {
        self.0
            .register(Box::new(c))
            .expect("metric registered once");
    }

    pub fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help))
    }

    pub fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels))
    }

    pub fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.add(GaugeVec::new(Opts::new(name, help), labels))
    }

    pub fn int_gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help))
    }

    pub fn int_gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    pub fn histograms(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels))
    }
}

/// The Prometheus text exposition of everything in `registry`.
pub fn encode_text(registry: &Registry) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 * 1024);
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .expect("text encoding into a Vec cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_encode_as_text() {
        let registry = Registry::new();
        let r = Registrar(&registry);
        r.counter("a_total", "A.").inc();
        r.counters("b_total", "B.", &["x"])
            .with_label_values(&["y"])
            .inc_by(2);
        r.histograms("c_seconds", "C.", &[], &[0.5])
            .with_label_values::<&str>(&[])
            .observe(0.1);
        let text = String::from_utf8(encode_text(&registry)).unwrap();
        for line in [
            "# TYPE a_total counter\na_total 1\n",
            "b_total{x=\"y\"} 2\n",
            "c_seconds_bucket{le=\"0.5\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    #[should_panic(expected = "metric registered once")]
    fn a_name_registered_twice_panics() {
        let registry = Registry::new();
        let r = Registrar(&registry);
        r.counter("a_total", "A.");
        r.counter("a_total", "A.");
    }
}
