//! `multiversion!`: a function compiled twice, for the x86-64 baseline and for AVX2 with FMA,
//! the second chosen at run time where the CPU has them. The per-pixel loops of the operations
//! then run eight values at a time and `mul_add` is one instruction instead of a call.
//! Both give the same bits: Rust never fuses a product into a sum by itself, and `mul_add`
//! is correctly rounded either way (libm's fmaf or the instruction).

/// `multiversion! { fn name / name_baseline (args) { body } }` defines `name`, which runs the
/// body compiled for AVX2 and FMA where the CPU has them and for the baseline elsewhere, and
/// `name_baseline`, always the latter (for tests that compare the two).
#[macro_export]
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident / $baseline:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn fast($($arg: $ty),*) {
                    $baseline($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has the features `fast` is compiled for.
                    return unsafe { fast($($arg),*) };
                }
            }
            $baseline($($arg),*)
        }

        /// The baseline build of the function above it.
        #[inline(always)]
        $vis fn $baseline($($arg: $ty),*) $body
    };
}
