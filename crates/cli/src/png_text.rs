//! Text in PNG plots, drawn with the shipped font glyph by glyph at its own bearing and on one
//! baseline. plotters 0.3.7's own ab_glyph path drops each glyph's left bearing and hangs every
//! glyph from half the font size, which reads as "51 2 KiB" and decimal points at mid-height.
//! Everything else goes to the wrapped backend unchanged.

use ab_glyph::{point, Font, FontRef, OutlinedGlyph, PxScale, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

/// A drawing backend whose text is laid out and rasterised with `font`.
pub(crate) struct GlyphText<B> {
    inner: B,
    font: FontRef<'static>,
}

impl<B> GlyphText<B> {
    pub(crate) fn new(inner: B, font: &'static [u8]) -> Result<GlyphText<B>, String> {
        let font = FontRef::try_from_slice(font).map_err(|e| format!("the shipped font: {e}"))?;
        Ok(GlyphText { inner, font })
    }

    /// `text`'s glyphs at `size` px, placed from the line's top left corner (the baseline one
    /// ascent down), and the line's width and height in pixels.
    fn layout(&self, text: &str, size: f64) -> (Vec<OutlinedGlyph>, i32, i32) {
        let scaled = self.font.as_scaled(PxScale::from(size as f32));
        let mut caret = 0.0f32;
        let mut previous = None;
        let mut glyphs = Vec::with_capacity(text.len());
        for c in text.chars() {
            let id = scaled.glyph_id(c);
            if let Some(previous) = previous {
                caret += scaled.kern(previous, id);
            }
            let glyph = id.with_scale_and_position(scaled.scale(), point(caret, scaled.ascent()));
            glyphs.extend(self.font.outline_glyph(glyph));
            caret += scaled.h_advance(id);
            previous = Some(id);
        }
        (glyphs, caret.ceil() as i32, (scaled.ascent() - scaled.descent()).ceil() as i32)
    }
}

impl<B: DrawingBackend> DrawingBackend for GlyphText<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<B::ErrorType>> {
        let (_, width, height) = self.layout(text, style.size());
        Ok((width.max(0) as u32, height.max(0) as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (glyphs, width, height) = self.layout(text, style.size());
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Center => -width / 2,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let transform = style.transform();
        let (canvas_width, canvas_height) = self.inner.get_size();
        let mut coverage = Vec::new();
        for glyph in &glyphs {
            let bounds = glyph.px_bounds();
            let (left, top) = (bounds.min.x as i32, bounds.min.y as i32);
            coverage.clear();
            glyph.draw(|x, y, share| coverage.push((left + x as i32, top + y as i32, share)));
            for &(x, y, share) in &coverage {
                let (x, y) = transform.transform(x + dx, y + dy);
                let (x, y) = (pos.0 + x, pos.1 + y);
                let inside = x >= 0 && y >= 0 && x < canvas_width as i32 && y < canvas_height as i32;
                if inside && share > 0.0 {
                    let alpha = color.alpha * f64::from(share.min(1.0));
                    self.inner.draw_pixel((x, y), BackendColor { alpha, rgb: color.rgb })?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;
    use plotters::style::text_anchor::Pos;

    /// The rows and columns of `text` drawn black at 40 px from (10, 10), top left anchored.
    fn inked(text: &str) -> Vec<(u32, u32)> {
        let (width, height) = (200u32, 80u32);
        let mut pixels = vec![255u8; (width * height * 3) as usize];
        {
            let bitmap = BitMapBackend::with_buffer(&mut pixels, (width, height));
            let backend = GlyphText::new(bitmap, include_bytes!("../assets/DejaVuSans.ttf")).unwrap();
            let area = backend.into_drawing_area();
            let style = ("sans-serif", 40).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Top));
            area.draw(&Text::new(text.to_string(), (10, 10), style)).unwrap();
            area.present().unwrap();
        }
        (0..height)
            .flat_map(|y| (0..width).map(move |x| (x, y)))
            .filter(|&(x, y)| pixels[((y * width + x) * 3) as usize] < 128)
            .collect()
    }

    #[test]
    fn glyphs_sit_on_one_baseline_and_keep_their_bearing() {
        let digit = inked("1");
        let point = inked(".");
        let digit_bottom = digit.iter().map(|p| p.1).max().unwrap();
        let digit_top = digit.iter().map(|p| p.1).min().unwrap();
        let point_top = point.iter().map(|p| p.1).min().unwrap();
        let point_bottom = point.iter().map(|p| p.1).max().unwrap();
        // On the baseline: the point ends where the digit does, in its lower fifth.
        assert!(
            point_bottom.abs_diff(digit_bottom) <= 1,
            "point ends at {point_bottom}, the digit at {digit_bottom}"
        );
        assert!(
            point_top > digit_top + (digit_bottom - digit_top) * 4 / 5,
            "the point floats at row {point_top}"
        );
        // Each glyph keeps its left side bearing: "1" is inked from the anchor plus its bearing
        // (plotters 0.3.7 inks it from the anchor itself, which is what spaced "512" as "51 2").
        let font = FontRef::try_from_slice(include_bytes!("../assets/DejaVuSans.ttf")).unwrap();
        let scaled = font.as_scaled(PxScale::from(40.0));
        let bearing = scaled.h_side_bearing(scaled.glyph_id('1'));
        assert!(bearing >= 2.0, "a glyph with a visible bearing: {bearing}");
        let left = digit.iter().map(|p| p.0).min().unwrap();
        assert!((left as f32 - (10.0 + bearing)).abs() <= 1.5, "inked from x {left}, bearing {bearing}");
    }
}
