//! The raw NVML MIG calls nvml-wrapper 0.13 does not wrap: the second (and last) `unsafe` module of the
//! crate, beside `metax::ffi`.
//!
//! The function pointers are nvml-wrapper's own ([`Nvml::lib`], loaded by `libloading` from the same
//! `libnvidia-ml.so.1`); device handles come from [`Device::handle`]. Every pointer is checked before use
//! (a driver without the symbol gives [`MigCallError::Missing`], never the bindings' panic), and NVML's
//! structures are filled by NVML itself (zeroed first) or, for the placement, are [`RawPlacement`], laid
//! out as `nvmlGpuInstancePlacement_t`.
//!
//! | function | NVML calls (`nvml.h`) |
//! |---|---|
//! | [`create`] | `nvmlDeviceGetGpuInstanceProfileInfo`, `nvmlDeviceCreateGpuInstanceWithPlacement`, `nvmlGpuInstanceGetInfo`, `nvmlGpuInstanceGetComputeInstanceProfileInfo`, `nvmlGpuInstanceCreateComputeInstance`, `nvmlComputeInstanceGetInfo_v2` (and `nvmlGpuInstanceDestroy` to undo a GPU instance whose compute instance failed) |
//! | [`destroy`] | `nvmlDeviceGetGpuInstanceById`, `nvmlGpuInstanceGetComputeInstanceProfileInfo`, `nvmlGpuInstanceGetComputeInstances`, `nvmlComputeInstanceDestroy`, `nvmlGpuInstanceDestroy` |
//! | [`instance_ids`] | `nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId` (of a MIG device handle) |
//! | [`gpu_instance_placement`] | `nvmlDeviceGetGpuInstanceById`, `nvmlGpuInstanceGetInfo` |
#![allow(unsafe_code)]

use nvml_wrapper::{Device, Nvml};
use vgpu_core::backend::MigPlacement;

use super::mig::{
    COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, COMPUTE_INSTANCE_PROFILE_COUNT, MigCallError,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS, RawPlacement,
};

/// A MIG device [`create`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Created {
    /// GPU instance id.
    pub(crate) gpu_instance_id: u32,
    /// Compute instance id (inside the GPU instance).
    pub(crate) compute_instance_id: u32,
    /// Where the driver put the GPU instance.
    pub(crate) placement: MigPlacement,
}

/// What [`create`] creates: the profile constants and the table's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CreateRequest<'a> {
    /// The profile's name (for errors).
    pub(crate) profile: &'a str,
    /// `NVML_GPU_INSTANCE_PROFILE_*`.
    pub(crate) gpu_instance_constant: u32,
    /// The profile id of the MIG table (`nvidia-smi mig -lgip`).
    pub(crate) expected_id: u32,
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*`.
    pub(crate) compute_instance_constant: u32,
    /// Where.
    pub(crate) placement: RawPlacement,
}

fn check(
    code: u32,
    index: u32,
    call: &'static str,
    subject: &dyn Fn() -> String,
) -> Result<(), MigCallError> {
    if code == NVML_SUCCESS {
        return Ok(());
    }
    let message =
        nvml_wrapper::error::nvml_try(code).err().map_or_else(|| "unknown".to_owned(), |e| e.to_string());
    Err(MigCallError::Failed { index, call, subject: subject(), code, message })
}

fn require<T, E>(symbol: &Result<T, E>, index: u32, call: &'static str) -> Result<(), MigCallError> {
    if symbol.is_ok() { Ok(()) } else { Err(MigCallError::Missing { index, call }) }
}

/// Creates a GPU instance of `request`'s profile at its placement and one compute instance spanning it. A
/// GPU instance whose compute instance cannot be created is destroyed again.
pub(crate) fn create(
    nvml: &Nvml,
    device: &Device<'_>,
    index: u32,
    request: &CreateRequest<'_>,
) -> Result<Created, MigCallError> {
    let lib = nvml.lib();
    require(&lib.nvmlDeviceGetGpuInstanceProfileInfo, index, "nvmlDeviceGetGpuInstanceProfileInfo")?;
    require(
        &lib.nvmlDeviceCreateGpuInstanceWithPlacement,
        index,
        "nvmlDeviceCreateGpuInstanceWithPlacement",
    )?;
    require(&lib.nvmlGpuInstanceGetInfo, index, "nvmlGpuInstanceGetInfo")?;
    require(
        &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
        index,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    )?;
    require(&lib.nvmlGpuInstanceCreateComputeInstance, index, "nvmlGpuInstanceCreateComputeInstance")?;
    require(&lib.nvmlComputeInstanceGetInfo_v2, index, "nvmlComputeInstanceGetInfo_v2")?;
    require(&lib.nvmlGpuInstanceDestroy, index, "nvmlGpuInstanceDestroy")?;
    let subject = || {
        format!(
            "profile {} at memory slice {} (size {})",
            request.profile, request.placement.start, request.placement.size
        )
    };

    // SAFETY: the handle is only passed to NVML below, while `device` (and the `Nvml` it borrows) lives.
    let handle = unsafe { device.handle() };

    // SAFETY: the symbol was checked above; `info` is a plain C struct NVML fills, zero is a valid value of
    // each of its integer fields, and the pointer is to a live local.
    let (code, profile_info) = unsafe {
        let mut info = std::mem::zeroed();
        let code = lib.nvmlDeviceGetGpuInstanceProfileInfo(
            handle,
            request.gpu_instance_constant,
            std::ptr::addr_of_mut!(info),
        );
        (code, info)
    };
    check(code, index, "nvmlDeviceGetGpuInstanceProfileInfo", &subject)?;
    if profile_info.id != request.expected_id {
        return Err(MigCallError::ProfileMismatch {
            index,
            profile: request.profile.to_owned(),
            constant: request.gpu_instance_constant,
            found: profile_info.id,
            expected: request.expected_id,
        });
    }

    let placement = request.placement;
    let mut gpu_instance = std::ptr::null_mut();
    // SAFETY: the symbol was checked; `placement` is `#[repr(C)] { u32, u32 }`, the layout of
    // `nvmlGpuInstancePlacement_t`, and NVML only reads it; `gpu_instance` is a live local NVML writes the
    // new handle to.
    let code = unsafe {
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle,
            profile_info.id,
            std::ptr::from_ref(&placement).cast(),
            std::ptr::addr_of_mut!(gpu_instance),
        )
    };
    check(code, index, "nvmlDeviceCreateGpuInstanceWithPlacement", &subject)?;

    // Everything after the GPU instance exists, in one closure (the handle types of the bindings cannot
    // be named here: nvml-wrapper does not re-export them), so that a failure undoes the GPU instance.
    let compute_instance_in = || -> Result<Created, MigCallError> {
        // SAFETY: symbol checked by `create`; `info` is a plain C struct NVML fills (zero is valid for its
        // pointer and integer fields); the pointer is to a live local.
        let (code, gi_info) = unsafe {
            let mut info = std::mem::zeroed();
            let code = lib.nvmlGpuInstanceGetInfo(gpu_instance, std::ptr::addr_of_mut!(info));
            (code, info)
        };
        check(code, index, "nvmlGpuInstanceGetInfo", &subject)?;

        // SAFETY: as above, for `nvmlComputeInstanceProfileInfo_t`.
        let (code, ci_profile) = unsafe {
            let mut info = std::mem::zeroed();
            let code = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance,
                request.compute_instance_constant,
                COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                std::ptr::addr_of_mut!(info),
            );
            (code, info)
        };
        check(code, index, "nvmlGpuInstanceGetComputeInstanceProfileInfo", &subject)?;

        let mut compute_instance = std::ptr::null_mut();
        // SAFETY: symbol checked; `gpu_instance` is live (created by `create`); NVML writes the new handle to
        // the live local `compute_instance`.
        let code = unsafe {
            lib.nvmlGpuInstanceCreateComputeInstance(
                gpu_instance,
                ci_profile.id,
                std::ptr::addr_of_mut!(compute_instance),
            )
        };
        check(code, index, "nvmlGpuInstanceCreateComputeInstance", &subject)?;

        // SAFETY: symbol checked; `compute_instance` was just created; `info` is a plain C struct NVML fills.
        let (code, ci_info) = unsafe {
            let mut info = std::mem::zeroed();
            let code = lib.nvmlComputeInstanceGetInfo_v2(compute_instance, std::ptr::addr_of_mut!(info));
            (code, info)
        };
        check(code, index, "nvmlComputeInstanceGetInfo_v2", &subject)?;

        Ok(Created {
            gpu_instance_id: gi_info.id,
            compute_instance_id: ci_info.id,
            placement: MigPlacement { start: gi_info.placement.start, size: gi_info.placement.size },
        })
    };
    let result = compute_instance_in();
    match result {
        Ok(created) => Ok(created),
        Err(err) => {
            // SAFETY: the symbol was checked; `gpu_instance` is the handle NVML just created and nothing
            // else uses it.
            let code = unsafe { lib.nvmlGpuInstanceDestroy(gpu_instance) };
            if code != NVML_SUCCESS {
                tracing::warn!(
                    index,
                    code,
                    "could not destroy the GPU instance whose compute instance failed"
                );
            }
            Err(err)
        }
    }
}

/// Destroys the compute instances of GPU instance `gpu_instance_id`, then the GPU instance. `Ok(false)` when
/// the GPU has no such GPU instance.
pub(crate) fn destroy(
    nvml: &Nvml,
    device: &Device<'_>,
    index: u32,
    gpu_instance_id: u32,
) -> Result<bool, MigCallError> {
    let lib = nvml.lib();
    require(&lib.nvmlDeviceGetGpuInstanceById, index, "nvmlDeviceGetGpuInstanceById")?;
    require(
        &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
        index,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    )?;
    require(&lib.nvmlGpuInstanceGetComputeInstances, index, "nvmlGpuInstanceGetComputeInstances")?;
    require(&lib.nvmlComputeInstanceDestroy, index, "nvmlComputeInstanceDestroy")?;
    require(&lib.nvmlGpuInstanceDestroy, index, "nvmlGpuInstanceDestroy")?;
    let subject = || format!("GPU instance {gpu_instance_id}");

    // SAFETY: the handle is only passed to NVML below, while `device` (and the `Nvml` it borrows) lives.
    let handle = unsafe { device.handle() };
    let mut gpu_instance = std::ptr::null_mut();
    // SAFETY: symbol checked; NVML writes the handle to the live local `gpu_instance`.
    let code = unsafe {
        lib.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id, std::ptr::addr_of_mut!(gpu_instance))
    };
    if code == NVML_ERROR_NOT_FOUND || code == NVML_ERROR_INVALID_ARGUMENT {
        return Ok(false);
    }
    check(code, index, "nvmlDeviceGetGpuInstanceById", &subject)?;

    for constant in 0..COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: symbol checked; `info` is a plain C struct NVML fills (zero is valid for its integer
        // fields); `gpu_instance` is the live handle NVML returned above.
        let (code, profile) = unsafe {
            let mut info = std::mem::zeroed();
            let code = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance,
                constant,
                COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                std::ptr::addr_of_mut!(info),
            );
            (code, info)
        };
        if code == NVML_ERROR_NOT_SUPPORTED || code == NVML_ERROR_INVALID_ARGUMENT {
            continue; // this GPU instance has no compute instance profile of this size
        }
        check(code, index, "nvmlGpuInstanceGetComputeInstanceProfileInfo", &subject)?;
        let capacity = profile.instanceCount.max(1);
        let mut count = capacity;
        let mut instances = vec![std::ptr::null_mut(); capacity as usize];
        // SAFETY: symbol checked; `instances` holds `count` writable handle slots and NVML writes at most
        // `count` of them, then the number written to `count`.
        let code = unsafe {
            lib.nvmlGpuInstanceGetComputeInstances(
                gpu_instance,
                profile.id,
                instances.as_mut_ptr(),
                std::ptr::addr_of_mut!(count),
            )
        };
        check(code, index, "nvmlGpuInstanceGetComputeInstances", &subject)?;
        for compute_instance in instances.into_iter().take(count.min(capacity) as usize) {
            // SAFETY: symbol checked; the handle was just returned by NVML for this GPU instance.
            let code = unsafe { lib.nvmlComputeInstanceDestroy(compute_instance) };
            check(code, index, "nvmlComputeInstanceDestroy", &subject)?;
        }
    }

    // SAFETY: symbol checked; the handle was returned by NVML above and its compute instances are gone.
    let code = unsafe { lib.nvmlGpuInstanceDestroy(gpu_instance) };
    check(code, index, "nvmlGpuInstanceDestroy", &subject)?;
    Ok(true)
}

/// The GPU instance and compute instance ids of a MIG device handle (from `mig_device_by_index`).
pub(crate) fn instance_ids(
    nvml: &Nvml,
    mig_device: &Device<'_>,
    index: u32,
) -> Result<(u32, u32), MigCallError> {
    let lib = nvml.lib();
    require(&lib.nvmlDeviceGetGpuInstanceId, index, "nvmlDeviceGetGpuInstanceId")?;
    require(&lib.nvmlDeviceGetComputeInstanceId, index, "nvmlDeviceGetComputeInstanceId")?;
    let subject = || "a MIG device".to_owned();
    // SAFETY: the handle is only passed to NVML below, while `mig_device` (and the `Nvml` it borrows) lives.
    let handle = unsafe { mig_device.handle() };
    let (mut gpu_instance_id, mut compute_instance_id) = (0_u32, 0_u32);
    // SAFETY: symbol checked; NVML writes one `unsigned int` to the live local.
    let code = unsafe { lib.nvmlDeviceGetGpuInstanceId(handle, std::ptr::addr_of_mut!(gpu_instance_id)) };
    check(code, index, "nvmlDeviceGetGpuInstanceId", &subject)?;
    // SAFETY: as above.
    let code =
        unsafe { lib.nvmlDeviceGetComputeInstanceId(handle, std::ptr::addr_of_mut!(compute_instance_id)) };
    check(code, index, "nvmlDeviceGetComputeInstanceId", &subject)?;
    Ok((gpu_instance_id, compute_instance_id))
}

/// Where GPU instance `gpu_instance_id` of a (parent) GPU sits.
pub(crate) fn gpu_instance_placement(
    nvml: &Nvml,
    device: &Device<'_>,
    index: u32,
    gpu_instance_id: u32,
) -> Result<MigPlacement, MigCallError> {
    let lib = nvml.lib();
    require(&lib.nvmlDeviceGetGpuInstanceById, index, "nvmlDeviceGetGpuInstanceById")?;
    require(&lib.nvmlGpuInstanceGetInfo, index, "nvmlGpuInstanceGetInfo")?;
    let subject = || format!("GPU instance {gpu_instance_id}");
    // SAFETY: the handle is only passed to NVML below, while `device` (and the `Nvml` it borrows) lives.
    let handle = unsafe { device.handle() };
    let mut gpu_instance = std::ptr::null_mut();
    // SAFETY: symbol checked; NVML writes the handle to the live local `gpu_instance`.
    let code = unsafe {
        lib.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id, std::ptr::addr_of_mut!(gpu_instance))
    };
    check(code, index, "nvmlDeviceGetGpuInstanceById", &subject)?;
    // SAFETY: symbol checked; `gpu_instance` is the live handle NVML returned; `info` is a plain C struct
    // NVML fills (zero is valid for its pointer and integer fields).
    let (code, info) = unsafe {
        let mut info = std::mem::zeroed();
        let code = lib.nvmlGpuInstanceGetInfo(gpu_instance, std::ptr::addr_of_mut!(info));
        (code, info)
    };
    check(code, index, "nvmlGpuInstanceGetInfo", &subject)?;
    Ok(MigPlacement { start: info.placement.start, size: info.placement.size })
}
