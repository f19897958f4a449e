//! The cost of an SQL92 filter over one record's properties: the broker's way (each
//! named property found in one pass over the record, then the expression evaluated) and a
//! look-up per name as the expression names it (the way before, which walked every pair
//! for each look-up). Cases: a usual filter over a usual record, and the worst the limits
//! allow (a 4 KiB expression naming one absent property ~580 times, over ~63 KiB of
//! properties in ~21,000 pairs).
//! Run: `cargo bench --bench filter`.

use criterion::{criterion_group, criterion_main, Criterion};
use ringmq::protocol::record::{Properties, PropertiesBuilder};
use ringmq::protocol::sql::SqlFilter;

fn one_pass(filter: &SqlFilter, props: &Properties<'_>) -> bool {
    ringmq::protocol::sql::with_values_of(filter, props, |values| filter.matches_values(values))
}

fn cases() -> Vec<(&'static str, SqlFilter, Vec<u8>)> {
    let mut usual = PropertiesBuilder::new();
    for (name, value) in [
        ("TAGS", "TagA"),
        ("KEYS", "order-17"),
        ("region", "eu"),
        ("amount", "120"),
    ] {
        usual.put(name, value).unwrap();
    }
    let usual_filter = SqlFilter::parse("region = 'eu' AND amount > 100").unwrap();
    let mut many = PropertiesBuilder::new();
    for _ in 0..21_000 {
        many.put("p", "").unwrap();
    }
    // Each term looks `x` up twice and is false (two missing values are equal, as in
    // RocketMQ), so every term is evaluated and nothing matches.
    let terms = vec!["x <> x"; 4096 / 10];
    let worst_filter = SqlFilter::parse(&terms.join(" OR ")).unwrap();
    vec![
        ("usual", usual_filter, usual.as_bytes().to_vec()),
        ("worst", worst_filter, many.as_bytes().to_vec()),
    ]
}

fn filters(c: &mut Criterion) {
    for (case, filter, bytes) in cases() {
        let props = Properties::new(&bytes);
        assert!(!one_pass(&filter, &props) || case == "usual");
        let mut g = c.benchmark_group(format!("sql_filter_{case}"));
        g.sample_size(10);
        g.bench_function("one_pass", |b| b.iter(|| one_pass(&filter, &props)));
        g.bench_function("lookup_per_name", |b| {
            b.iter(|| filter.matches(&|name| props.get(name)))
        });
        g.finish();
    }
}

criterion_group!(benches, filters);
criterion_main!(benches);
