//! Padded batches (shapes, layout, padding) and the seeded batch order (each epoch a permutation,
//! batch `k` a pure function of the seed and `k`).

use std::collections::HashSet;

use attn_train::data::vocab::{BOS, EOS, PAD};
use attn_train::data::{Batch, BatchOrder, DataError, DatesTask, Pair, Vocab};
use candle_core::{DType, Device};

fn pairs(items: &[(&str, &str)]) -> Vec<Pair> {
    items.iter().map(|&(s, t)| (s.to_string(), t.to_string())).collect()
}

#[test]
fn batch_layout_and_padding() {
    let v = Vocab::from_texts(["abcdxyz"]);
    let ps = pairs(&[("ab", "xyz"), ("abcd", "x"), ("c", "zz")]);
    let b = Batch::new(&ps, &v, &Device::Cpu).unwrap();
    assert_eq!(
        (b.src.dims(), b.tgt_in.dims(), b.tgt_out.dims()),
        ([3, 5].as_slice(), [3, 4].as_slice(), [3, 4].as_slice())
    );
    assert!([&b.src, &b.tgt_in, &b.tgt_out].iter().all(|t| t.dtype() == DType::U32));
    let id = |c| v.id(c);
    assert_eq!(
        b.src.to_vec2::<u32>().unwrap(),
        [
            vec![id('a'), id('b'), EOS, PAD, PAD],
            vec![id('a'), id('b'), id('c'), id('d'), EOS],
            vec![id('c'), EOS, PAD, PAD, PAD]
        ]
    );
    assert_eq!(
        b.tgt_in.to_vec2::<u32>().unwrap(),
        [vec![BOS, id('x'), id('y'), id('z')], vec![BOS, id('x'), PAD, PAD], vec![BOS, id('z'), id('z'), PAD]]
    );
    assert_eq!(
        b.tgt_out.to_vec2::<u32>().unwrap(),
        [vec![id('x'), id('y'), id('z'), EOS], vec![id('x'), EOS, PAD, PAD], vec![id('z'), id('z'), EOS, PAD]]
    );
    assert_eq!((b.src_tokens, b.tgt_tokens), (3 + 5 + 2, 4 + 2 + 3));
}

#[test]
fn dates_batches_decode_back_to_their_pairs() {
    let task = DatesTask::new(2);
    let v = DatesTask::vocab();
    let ps = task.train_pairs(0, 32);
    let b = Batch::new(&ps, &v, &Device::Cpu).unwrap();
    assert_eq!(b.tgt_out.dims(), [32, 11]); // ten characters then eos
    let longest = ps.iter().map(|(s, _)| s.chars().count()).max().unwrap();
    assert_eq!(b.src.dims(), [32, longest + 1]);
    for ((s, t), (src, out)) in
        ps.iter().zip(b.src.to_vec2::<u32>().unwrap().iter().zip(b.tgt_out.to_vec2::<u32>().unwrap()))
    {
        assert_eq!((v.decode(src), v.decode(&out)), (s.clone(), t.clone()));
    }
}

#[test]
fn an_empty_batch_is_refused() {
    let err = Batch::new(&[], &Vocab::from_texts(["a"]), &Device::Cpu).unwrap_err();
    assert!(matches!(err, DataError::Argument { what: "Batch::new: pairs", .. }), "{err:?}");
}

#[test]
fn every_epoch_visits_every_item_once() {
    let order = BatchOrder::new(10, 4, 3).unwrap();
    assert_eq!(order.batches_per_epoch(), 3);
    let run: Vec<Vec<usize>> = order.iter_from(0).take(9).collect();
    for epoch in run.chunks(3) {
        assert_eq!(epoch.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);
        let mut seen: Vec<usize> = epoch.concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
    }
    let epochs: HashSet<Vec<usize>> = (0..3).map(|e| order.permutation(e)).collect();
    assert_eq!(epochs.len(), 3, "epochs repeat the same order");
    assert_ne!(order.permutation(0), (0..10).collect::<Vec<_>>());
}

#[test]
fn batch_k_is_a_function_of_seed_and_k() {
    let order = BatchOrder::new(1000, 32, 42).unwrap();
    let from_start: Vec<Vec<usize>> = order.iter_from(0).take(200).collect();
    let resumed: Vec<Vec<usize>> = order.iter_from(77).take(123).collect();
    assert_eq!(from_start[77..], resumed[..], "a resumed run differs");
    for k in [0u64, 31, 32, 33, 150, 199] {
        assert_eq!(order.batch(k), from_start[k as usize]);
    }
    assert_eq!(BatchOrder::new(1000, 32, 42).unwrap().batch(500), order.batch(500));
    assert_ne!(BatchOrder::new(1000, 32, 43).unwrap().batch(0), order.batch(0));
}

#[test]
fn batch_order_edge_sizes() {
    let one_batch = BatchOrder::new(3, 8, 0).unwrap();
    assert_eq!(one_batch.batches_per_epoch(), 1);
    assert_eq!(one_batch.batch(5).len(), 3);
    for (len, batch) in [(0, 4), (4, 0)] {
        let err = BatchOrder::new(len, batch, 0).unwrap_err();
        assert!(
            matches!(err, DataError::Argument { .. })
                && err.to_string().ends_with("expected a positive number, found 0"),
            "{err}"
        );
    }
}
