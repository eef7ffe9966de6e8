//! insta snapshots of every weight map resolved against each fixture's config: the table
//! "checkpoint name → engine slot [shape] transform". Any change to a mapping shows up as
//! a snapshot diff. Also checks each map covers its fixture checkpoint exactly.

use porter_core::registry;
use tests::fixture;

fn table(name: &str) -> String {
    let p = registry::prepare(&fixture(name)).expect("prepare");
    p.map.validate(&p.checkpoint).unwrap_or_else(|e| panic!("{name}: {e}"));
    p.map.render_table()
}

macro_rules! snap {
    ($($test:ident => $fixture:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            insta::assert_snapshot!($fixture, table($fixture));
        }
    )*};
}

snap! {
    qwen3 => "qwen3",
    qwen3_tied => "qwen3_tied",
    qwen3_moe => "qwen3_moe",
    qwen3_moe_sparse2 => "qwen3_moe_sparse2",
    mistral => "mistral",
    mistral_swa => "mistral_swa",
    qwen3_next_a => "qwen3_next_a",
    qwen3_next_b => "qwen3_next_b",
    qwen3_next_mtp_sharded => "qwen3_next_mtp",
}
