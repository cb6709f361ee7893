//! One walk over a decoder layer's modules, in mlx-lm's declaration order, that gives both
//! what adapters convert (the linears and switch linears, under their paths inside the layer)
//! and what full fine-tuning trains (every array, under its full name). A port writes its
//! layer's structure once, as a [`Walkable`], instead of one enumerator for each.

use mlx_core::prelude::Array;

use super::{join, LayerParam, Linear, LinearMut, Norm, RmsNorm, SwitchLinear};
use crate::error::{ModelError, Result};

/// A module whose parts a [`Walk`] visits.
pub trait Walkable {
    /// Visits the module's linears, switch linears, norms and arrays under `path` (relative to
    /// the walk's root), in the order mlx-lm's Python module declares them.
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>);
}

/// What a walk collects: the linears (adapters) or every array (full fine-tuning).
pub struct Walk<'a> {
    root: String,
    linears: Option<Vec<(String, LinearMut<'a>)>>,
    params: Vec<LayerParam<'a>>,
    error: Option<ModelError>,
}

impl<'a> Walk<'a> {
    fn new(root: &str, linears: bool) -> Walk<'a> {
        Walk {
            root: root.to_string(),
            linears: linears.then(Vec::new),
            params: Vec::new(),
            error: None,
        }
    }

    /// The linears and switch linears `f` walks, under their paths.
    pub fn linears(f: impl FnOnce(&mut Walk<'a>)) -> Vec<(String, LinearMut<'a>)> {
        let mut w = Walk::new("", true);
        f(&mut w);
        w.linears.unwrap_or_default()
    }

    /// Every array `f` walks, under `root` (`model.layers.<i>`), as mlx-lm names them; an
    /// error when a linear is adapted (it has no arrays of its own).
    pub fn params(root: &str, f: impl FnOnce(&mut Walk<'a>)) -> Result<Vec<LayerParam<'a>>> {
        let mut w = Walk::new(root, false);
        f(&mut w);
        match w.error {
            Some(e) => Err(e),
            None => Ok(w.params),
        }
    }

    /// [`Walk::linears`] of a module.
    pub fn linears_of<T: Walkable + ?Sized>(m: &'a mut T) -> Vec<(String, LinearMut<'a>)> {
        Walk::linears(move |w| m.walk("", w))
    }

    /// [`Walk::params`] of a module.
    pub fn params_of<T: Walkable + ?Sized>(
        m: &'a mut T,
        root: &str,
    ) -> Result<Vec<LayerParam<'a>>> {
        Walk::params(root, move |w| m.walk("", w))
    }

    fn full(&self, path: &str) -> String {
        join(&self.root, path)
    }

    /// A linear (adapters may wrap it).
    pub fn linear(&mut self, path: &str, l: &'a mut Linear) {
        let full = self.full(path);
        match &mut self.linears {
            Some(out) => out.push((full, LinearMut::Linear(l))),
            None => {
                if let Err(e) = l.parameters_mut(&full, &mut self.params) {
                    self.error.get_or_insert(e);
                }
            }
        }
    }

    /// An optional linear.
    pub fn linear_opt(&mut self, path: &str, l: Option<&'a mut Linear>) {
        if let Some(l) = l {
            self.linear(path, l);
        }
    }

    /// A switch (per-expert) linear.
    pub fn switch(&mut self, path: &str, l: &'a mut SwitchLinear) {
        let full = self.full(path);
        match &mut self.linears {
            Some(out) => out.push((full, LinearMut::Switch(l))),
            None => l.parameters_mut(&full, &mut self.params),
        }
    }

    /// A norm's arrays (full fine-tuning only).
    pub fn norm(&mut self, path: &str, n: &'a mut Norm) {
        if self.linears.is_none() {
            let full = self.full(path);
            n.parameters_mut(&full, &mut self.params);
        }
    }

    /// An RMS norm's weight (full fine-tuning only).
    pub fn rms_norm(&mut self, path: &str, n: &'a mut RmsNorm) {
        if self.linears.is_none() {
            let full = self.full(path);
            n.parameters_mut(&full, &mut self.params);
        }
    }

    /// A module's own array `leaf` under `path` (full fine-tuning only).
    pub fn array(&mut self, path: &str, leaf: &str, a: &'a mut Array) {
        if self.linears.is_none() {
            let full = self.full(path);
            LayerParam::push(&mut self.params, &full, leaf, a, false);
        }
    }

    /// A sub-module under `path`.
    pub fn module<T: Walkable + ?Sized>(&mut self, path: &str, m: &'a mut T) {
        m.walk(path, self);
    }
}
