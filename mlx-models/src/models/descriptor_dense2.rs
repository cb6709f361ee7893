//! Rows of issue #32 (the dense rest and the multimodal wrappers' text towers), in their own
//! file so the table in `descriptor.rs` only gains their entries. Each row names the mlx-lm
//! file it follows.

use serde_json::Value;

use super::*;

/// `models/qwen.py` (Qwen 1): fused `c_attn` (with bias) split in three, `[w2 | w1]` SwiGLU
/// of half the intermediate size, biases per `no_bias`, an untied head.
pub(super) fn qwen(c: &Cfg) -> Result<Descriptor> {
    let heads = c.i32_or("num_attention_heads", 16)?;
    let hidden = c.i32_or("hidden_size", 2048)?;
    let k = Common {
        hidden,
        layers: c.i32_or("num_hidden_layers", 24)?,
        inter: c.i32_or("intermediate_size", 11008)? / 2,
        heads,
        kv_heads: heads,
        vocab: c.i32_or("vocab_size", 151936)?,
    };
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("hidden_size", "must be divisible by num_attention_heads"));
    }
    let per_head = hidden / heads;
    let kv_channels = c.i32_or("kv_channels", 128)?;
    let mut d = base(
        "qwen",
        &k,
        kv_channels,
        c.f64_or("layer_norm_epsilon", 1e-6)?,
    );
    d.attn_scale = scale_of(per_head);
    let bias = !c.bool_or("no_bias", true)?;
    d.qkv_bias = true;
    (d.o_bias, d.mlp_bias, d.down_bias, d.lm_head_bias) = (bias, bias, bias, bias);
    d.rope = Some(RopeSpec::plain(per_head, 10000.0, false));
    d.head = Head::Untied;
    d.names = Names {
        embed: "transformer.wte",
        layers: "transformer.h",
        final_norm: "transformer.ln_f",
        attn: "attn",
        qkv: Some("c_attn"),
        o: "c_proj",
        mlp_names: MlpNames {
            gate: "w2",
            up: "w1",
            down: "c_proj",
            gate_up: None,
            up_first: false,
        },
        pre_attn_norm: "ln_1",
        pre_mlp_norm: "ln_2",
        ..Names::LLAMA
    };
    Ok(d)
}

/// `models/lille-130m.py`: the norms inside the attention and the feed-forward modules, a
/// fused `qkv_proj`, traditional rope, the embedding always tied.
pub(super) fn lille_130m(c: &Cfg) -> Result<Descriptor> {
    let hidden = c.i32("n_embd")?;
    let heads = c.i32("n_head")?;
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("n_embd", "must be divisible by n_head"));
    }
    c.i32("block_size")?;
    // `256 * round(int(8 * n_embd / 3) / 256)`, Python's round (ties to even).
    let inter = 256 * ((f64::from(hidden) * 8.0 / 3.0).trunc() / 256.0).round_ties_even() as i32;
    let k = Common {
        hidden,
        layers: c.i32("n_layer")?,
        inter,
        heads,
        kv_heads: c.i32("n_kv_heads")?,
        vocab: c.i32("vocab_size")?,
    };
    let hd = hidden / heads;
    let mut d = base("lille-130m", &k, hd, c.f64("layer_norm_eps")?);
    d.rope = Some(RopeSpec::plain(hd, c.f64("rope_theta")?, true));
    d.head = Head::Tied;
    d.names = Names {
        embed: "transformer.tok_embeddings",
        layers: "transformer.layers",
        final_norm: "transformer.norm",
        attn: "attention",
        qkv: Some("qkv_proj"),
        o: "out_proj",
        mlp: "feed_forward",
        pre_attn_norm: "attention.norm",
        pre_mlp_norm: "feed_forward.norm",
        ..Names::LLAMA
    };
    Ok(d)
}

/// The text part of a Qwen-VL wrapper: `text_config`, or the whole config when it has none
/// (`ModelArgs.from_dict`); `sanitize` drops `visual` / `vision_tower`, takes a nested
/// `model.language_model` as the model, and prefixes the rest with `language_model.`.
fn qwen_vl(c: &Cfg, row: RowFn, model_type: &'static str) -> Result<Descriptor> {
    let text = match c.get("text_config") {
        Some(Value::Object(m)) => Value::Object(m.clone()),
        Some(v) => return Err(c.err("text_config", &format!("must be an object, got {v}"))),
        None => Value::Object(c.obj.clone()),
    };
    let inner = Cfg::new(&text, c.ty)?;
    let mut d = row(&inner)?;
    d.model_type = model_type.into();
    d.defines_make_cache = false;
    d.drop_layer_tensors.clear();
    d.hf_renames = Some(HfRenames {
        drop_suffixes: &[],
        conv1d_suffixes: &[],
        add_prefix: None,
        replace: &[("model.language_model.", "model.")],
    });
    d.drop_prefixes
        .extend(["visual.", "vision_tower.", "model.visual."]);
    d.strip_prefix = Some("language_model.");
    Ok(d)
}

/// `models/qwen2_vl.py` (and `qwen2_5_vl`): the qwen2 text model.
pub(super) fn qwen2_vl(c: &Cfg) -> Result<Descriptor> {
    qwen_vl(c, qwen2, "qwen2_vl")
}

/// `models/qwen3_vl.py`: the qwen3 text model.
pub(super) fn qwen3_vl(c: &Cfg) -> Result<Descriptor> {
    qwen_vl(c, qwen3, "qwen3_vl")
}

/// `models/pixtral.py`: the llama text model, untied, 32 heads unless given.
pub(super) fn pixtral(c: &Cfg) -> Result<Descriptor> {
    let mut t = text_config(c)?;
    t.insert("tie_word_embeddings".into(), false.into());
    if !t.contains_key("num_attention_heads") {
        t.insert("num_attention_heads".into(), 32.into());
    }
    let mut d = wrapped(c, Value::Object(t), llama, "pixtral")?;
    d.defines_make_cache = false;
    d.drop_layer_tensors.clear();
    Ok(d)
}

/// `models/plamo.py` (PLaMo 1): `ceil(heads / n_shared_head)` KV heads tiled `n_shared_head`
/// times after the cache, one norm before a parallel attention and MLP, an untied head.
pub(super) fn plamo(c: &Cfg) -> Result<Descriptor> {
    let heads = c.i32("num_attention_heads")?;
    let hidden = c.i32("hidden_size")?;
    let shared = c.i32_or("n_shared_head", 8)?;
    if heads <= 0 || hidden % heads != 0 {
        return Err(c.err("hidden_size", "must be divisible by num_attention_heads"));
    }
    if shared <= 0 {
        return Err(c.err("n_shared_head", "must be positive"));
    }
    let kv_heads = (heads + shared - 1) / shared;
    if kv_heads * shared != heads {
        return Err(c.err(
            "n_shared_head",
            &format!("times ceil(num_attention_heads / n_shared_head) must equal num_attention_heads ({heads})"),
        ));
    }
    let k = Common {
        hidden,
        layers: c.i32("num_hidden_layers")?,
        inter: c.i32("intermediate_size")?,
        heads,
        kv_heads,
        vocab: c.i32("vocab_size")?,
    };
    let hd = hidden / heads;
    let mut d = base("plamo", &k, hd, c.f64("rms_norm_eps")?);
    d.placement = Placement::ParallelResidualFirst;
    d.kv_tile = Some(shared);
    d.rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
    ));
    d.head = Head::Untied;
    d.names = Names {
        layers: "model.layers.layers",
        pre_attn_norm: "norm",
        ..Names::LLAMA
    };
    Ok(d)
}

/// A list of numbers (`num_query_heads`, `ffn_multipliers`), one per layer.
fn numbers(c: &Cfg, k: &str, layers: i32) -> Result<Vec<f64>> {
    let list = match c.get(k) {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(c.err(k, &format!("must be a list, got {v}"))),
        None => return Err(c.err(k, "is required but missing")),
    };
    if list.len() != layers.max(0) as usize {
        return Err(c.err(
            k,
            &format!("has {} entries for {layers} layers", list.len()),
        ));
    }
    list.iter()
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| c.err(k, "must be a list of numbers"))
        })
        .collect()
}

/// `openelm.py`'s `make_divisible(v, divisor)`.
fn make_divisible(v: f64, divisor: i64) -> i64 {
    let d = divisor as f64;
    let mut new_v = divisor.max(((v + d / 2.0).trunc() as i64).div_euclid(divisor) * divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

/// `models/openelm.py`: per-layer head counts and MLP widths, a fused `qkv_proj` split over
/// heads, per-head q/k RMSNorm after the heads' transpose, a fused `[gate | up]` `proj_1`.
pub(super) fn openelm(c: &Cfg) -> Result<Descriptor> {
    let layers = c.i32("num_transformer_layers")?;
    let hidden = c.i32("model_dim")?;
    let hd = c.i32("head_dim")?;
    let divisor = i64::from(c.i32("ffn_dim_divisor")?);
    if divisor <= 0 {
        return Err(c.err("ffn_dim_divisor", "must be positive"));
    }
    let int = |k: &str, v: f64| -> Result<i32> {
        if v.fract() != 0.0 || !(1.0..=f64::from(i32::MAX)).contains(&v) {
            return Err(c.err(k, &format!("must hold positive integers, got {v}")));
        }
        Ok(v as i32)
    };
    let q = numbers(c, "num_query_heads", layers)?;
    let kv = numbers(c, "num_kv_heads", layers)?;
    let mult = numbers(c, "ffn_multipliers", layers)?;
    let mut shapes = Vec::with_capacity(q.len());
    for i in 0..q.len() {
        let (h, k) = (int("num_query_heads", q[i])?, int("num_kv_heads", kv[i])?);
        if h % k != 0 {
            return Err(c.err(
                "num_query_heads",
                &format!("layer {i}: {h} query heads are not a multiple of {k} KV heads"),
            ));
        }
        let inter = make_divisible(mult[i] * f64::from(hidden), divisor);
        let inter = i32::try_from(inter)
            .map_err(|_| c.err("ffn_multipliers", &format!("layer {i}: width {inter}")))?;
        shapes.push((h, k, inter));
    }
    let first = shapes.first().copied().unwrap_or((1, 1, 1));
    let k = Common {
        hidden,
        layers,
        inter: first.2,
        heads: first.0,
        kv_heads: first.1,
        vocab: c.i32("vocab_size")?,
    };
    let mut d = base("openelm", &k, hd, c.f64_or("rms_norm_eps", 1e-6)?);
    d.layer_shapes = shapes;
    if c.bool_or("normalize_qk_projections", true)? {
        d.qk_norm = QkNorm::PerHeadTransposed;
    }
    // `ffn_with_glu` is read but unused by mlx-lm: the MLP is always gated.
    d.rope = Some(RopeSpec::plain(
        hd,
        c.f64_or("rope_freq_constant", 10000.0)?,
        false,
    ));
    d.head = tie(c.bool_or("share_input_output_layers", true)?);
    d.names = Names {
        embed: "transformer.token_embeddings",
        layers: "transformer.layers",
        final_norm: "transformer.norm",
        attn: "attn",
        qkv: Some("qkv_proj"),
        o: "out_proj",
        mlp: "ffn",
        mlp_names: MlpNames {
            gate: "",
            up: "",
            down: "proj_2",
            gate_up: Some("proj_1"),
            up_first: false,
        },
        pre_attn_norm: "attn_norm",
        pre_mlp_norm: "ffn_norm",
        ..Names::LLAMA
    };
    Ok(d)
}

/// `models/nanbeige.py`: a llama stack applied `num_loops` times with shared weights (one
/// more than `loop_loss_weights` holds when given), each pass with its own caches and, unless
/// `skip_loop_final_norm`, ending with the final norm.
pub(super) fn nanbeige(c: &Cfg) -> Result<Descriptor> {
    for k in [
        "enable_double_loop_split",
        "loop_share_kv",
        "enable_depth_attention",
    ] {
        if c.bool_or(k, false)? {
            return Err(c.err(k, "is not supported (nor by mlx-lm)"));
        }
    }
    let k = common(c, true)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("nanbeige", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        false,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", false)?);
    let loops = match c.get("loop_loss_weights") {
        Some(Value::Array(a)) if !a.is_empty() => a.len() as i64 + 1,
        _ => c.opt_i64("num_loops")?.unwrap_or(1),
    };
    if !(1..=64).contains(&loops) {
        return Err(c.err("num_loops", &format!("must be 1 to 64, got {loops}")));
    }
    d.loops = loops as usize;
    d.loop_norm = !c.bool_or("skip_loop_final_norm", false)?;
    d.defines_make_cache = true;
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}

/// `models/plamo3.py`: sandwich norms with offsets (`weight + 1` before, `+ 1/5` and
/// `+ 1/5 ** 1.5` after the mixer and the MLP), per-head q/k norms (`+ 1`) after the heads'
/// transpose, sliding layers (every `sliding_window_pattern`-th layer is full) with their own
/// rope base and a mask one wider than their rotating cache, a fused `[gate | up]` MLP.
pub(super) fn plamo3(c: &Cfg) -> Result<Descriptor> {
    let k = Common {
        hidden: c.i32_or("hidden_size", 4096)?,
        layers: c.i32_or("num_hidden_layers", 32)?,
        inter: c.i32_or("intermediate_size", 13312)?,
        heads: c.i32_or("num_attention_heads", 32)?,
        kv_heads: c.i32_or("num_key_value_heads", 4)?,
        vocab: c.i32_or("vocab_size", 32000)?,
    };
    let hd = c.i32_or("head_dim", 128)?;
    let mut d = base("plamo3", &k, hd, c.f64_or("rms_norm_eps", 1e-6)?);
    d.norm = NormKind::RmsOffset;
    d.placement = Placement::Sandwich;
    d.post_norm_offsets = Some(((1.0f64 / 5.0) as f32, (1.0 / 5f64.powf(1.5)) as f32));
    d.qk_norm = QkNorm::PerHeadTransposed;
    let window = match c.opt_i64("sliding_window")? {
        Some(w) => w,
        None => c.opt_i64("window_size")?.unwrap_or(2048),
    };
    if window <= 0 {
        return Err(c.err("window_size", &format!("must be positive, got {window}")));
    }
    let pattern = c.i32_or("sliding_window_pattern", 8)?;
    if pattern <= 0 {
        return Err(c.err("sliding_window_pattern", "must be positive"));
    }
    d.sliding = (0..k.layers.max(0))
        .map(|i| (i + 1) % pattern != 0)
        .collect();
    d.sliding_window = Some(window as usize);
    d.sliding_mask_window = Some(window as usize + 1);
    let rope_at = |theta: f64| RopeSpec::plain(hd, theta, false);
    d.rope = Some(rope_at(c.f64_or("rope_theta", 1_000_000.0)?));
    d.local_rope = Some(rope_at(c.f64_or("rope_local_theta", 10_000.0)?));
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    d.defines_make_cache = true;
    d.names = Names {
        layers: "model.layers.layers",
        attn: "mixer",
        qkv: Some("qkv_proj"),
        mlp_names: MlpNames {
            gate: "",
            up: "",
            down: "down_proj",
            gate_up: Some("gate_up_proj"),
            up_first: false,
        },
        pre_attn_norm: "pre_mixer_norm",
        post_attn_norm: "post_mixer_norm",
        pre_mlp_norm: "pre_mlp_norm",
        post_mlp_norm: "post_mlp_norm",
        ..Names::LLAMA
    };
    Ok(d)
}

/// `models/bitnet.py` (with `bitlinear_layers.py`): a llama whose linears are packed ternary
/// BitLinears, unpacked at load (mlx-lm multiplies them in a Metal kernel only), with
/// `attn_sub_norm` before `o_proj`, `ffn_sub_norm` before `down_proj` and a `relu2` gate.
/// Tier L2: equal to mlx-lm's model on the unpacked weights, not to its kernel's sums.
pub(super) fn bitnet(c: &Cfg) -> Result<Descriptor> {
    let k = common(c, true)?;
    let hd = head_dim_or(c, k.hidden, k.heads)?;
    let mut d = base("bitnet", &k, hd, c.f64("rms_norm_eps")?);
    let bias = c.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let mlp_bias = c.bool_or("mlp_bias", false)?;
    (d.mlp_bias, d.down_bias) = (mlp_bias, mlp_bias);
    d.mlp = MlpKind::Relu2Glu;
    d.sub_norms = true;
    d.rope = Some(rope(
        hd,
        c.f64_or("rope_theta", 10000.0)?,
        c.bool_or("rope_traditional", false)?,
        c,
        c.opt_i64("max_position_embeddings")?,
    )?);
    d.head = tie(c.bool_or("tie_word_embeddings", true)?);
    // `bitnet_quantize` turns the remaining `nn.Linear`s (an untied `lm_head`) into
    // BitLinears too, dividing by their scale unless `linear_class` is `autobitlinear`.
    let qc = match c.get("quantization_config") {
        Some(Value::Object(q)) => Some(q),
        _ => None,
    };
    let invert =
        qc.is_some_and(|q| q.get("linear_class").and_then(Value::as_str) != Some("autobitlinear"));
    d.bitlinear = Some(invert);
    d.drop_layer_tensors = vec![INV_FREQ];
    Ok(d)
}
