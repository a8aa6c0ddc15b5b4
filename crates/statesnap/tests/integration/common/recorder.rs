//! A recorder for the `metrics` facade, for tests that check what reaches
//! it (install it with `metrics::with_local_recorder`).

use std::sync::Arc;

/// A recorder for the `metrics` facade that keeps the last value of each
/// counter and gauge (by name) and every histogram sample.
#[derive(Debug, Default)]
pub struct Recorded {
    values: std::sync::Mutex<std::collections::BTreeMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    samples: std::sync::Mutex<std::collections::BTreeMap<String, Arc<Samples>>>,
}

#[derive(Debug, Default)]
pub struct Samples(std::sync::Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl Recorded {
    fn slot(&self, key: &metrics::Key) -> Arc<std::sync::atomic::AtomicU64> {
        let mut v = self.values.lock().unwrap();
        Arc::clone(v.entry(key.name().to_owned()).or_default())
    }
    pub fn counter(&self, name: &str) -> u64 {
        let v = self.values.lock().unwrap();
        v.get(name)
            .map_or(0, |a| a.load(std::sync::atomic::Ordering::SeqCst))
    }
    pub fn gauge(&self, name: &str) -> f64 {
        f64::from_bits(self.counter(name))
    }
    pub fn samples(&self, name: &str) -> usize {
        let s = self.samples.lock().unwrap();
        s.get(name).map_or(0, |h| h.0.lock().unwrap().len())
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        let mut s = self.samples.lock().unwrap();
        metrics::Histogram::from_arc(Arc::clone(s.entry(key.name().to_owned()).or_default()))
    }
}
