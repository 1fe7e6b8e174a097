"""Executable and loaded-executable functions, Execute among them (the per-call hot path)."""
from __future__ import annotations

import ctypes

from pypjrt._abi.pjrt_0_114 import PJRT_Executable_GetCompiledMemoryStats_Args, PJRT_ExecuteOptions, PJRT_Program

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.callbacks import has_field, implements, pointer_array
from polyblocks_jax.pjrt.c_values import Text
from polyblocks_jax.pjrt.events import handle_of
from polyblocks_jax.pjrt.executable import ExecutableRef
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.spmd_executable import SpmdLoadedExecutable
from polyblocks_jax.runtime.foreign_memory import array_type

_BYTES_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Serialized bytes handed to jaxlib stay in the handle table until it calls this deleter.
_RELEASE = _BYTES_DELETER(lambda handle, _release=handles.release: _release(handle) and None)
_RELEASE_ADDRESS = ctypes.cast(_RELEASE, ctypes.c_void_p).value
_NO_DELETE = _BYTES_DELETER(lambda handle: None)


def _executable(handle):
    return handles.LIVE[handle].executable


@implements("PJRT_LoadedExecutable_Execute")
def loaded_execute(args):
    loaded = handles.LIVE[args.executable]
    if args.num_devices != 1 or isinstance(loaded, SpmdLoadedExecutable):
        _execute_devices(loaded, args)
        return
    if args.execute_device and args.execute_device != loaded.device.handle:
        raise invalid("execute_device is not the executable's device")
    argument_list = ctypes.c_void_p.from_address(args.argument_lists).value
    lookup = handles.LIVE.__getitem__
    buffers = [lookup(h) for h in pointer_array(argument_list, args.num_args)]
    outputs = loaded.execute(buffers, _non_donatable(args.options))
    if outputs:  # a program of no outputs (only effects, e.g. a debug print) gets no list
        out_list = array_type(ctypes.c_void_p, len(outputs)).from_address(
            ctypes.c_void_p.from_address(args.output_lists).value)
        for i, buffer in enumerate(outputs):
            out_list[i] = buffer.handle
    if args.device_complete_events:
        ctypes.c_void_p.from_address(args.device_complete_events).value = handle_of(loaded.completion(outputs))


def _execute_devices(loaded, args) -> None:
    """Execute a program of several devices (pjrt/spmd_executable.py)."""
    if not isinstance(loaded, SpmdLoadedExecutable):
        raise invalid(f"execution on {args.num_devices} devices of a program for one")
    loaded.execute(args, _non_donatable(args.options))


def _non_donatable(options_address: int | None) -> frozenset[int]:
    if not options_address:
        return frozenset()
    options = PJRT_ExecuteOptions.from_address(options_address)
    count = options.num_non_donatable_input_indices
    if not count:
        return frozenset()
    return frozenset(array_type(ctypes.c_int64, count).from_address(options.non_donatable_input_indices))


@implements("PJRT_LoadedExecutable_Destroy")
def loaded_destroy(args, _release=handles.release):
    _release(args.executable)


@implements("PJRT_LoadedExecutable_GetExecutable")
def loaded_get_executable(args):
    executable = handles.lookup(args.loaded_executable).executable
    args.executable = handles.register(ExecutableRef(executable), handles.EXECUTABLE, executable.num_outputs)


@implements("PJRT_LoadedExecutable_AddressableDevices")
def loaded_addressable_devices(args):
    devices = handles.lookup(args.executable).devices
    args.addressable_devices, args.num_addressable_devices = devices.address, devices.count


@implements("PJRT_LoadedExecutable_AddressableDeviceLogicalIds")
def loaded_logical_ids(args):
    ids = handles.lookup(args.executable).logical_ids
    args.addressable_device_logical_ids, args.num_addressable_device_logical_ids = ctypes.addressof(ids), len(ids) // 2


@implements("PJRT_LoadedExecutable_GetDeviceAssignment")
def loaded_device_assignment(args):
    assignment = handles.lookup(args.executable).device_assignment
    args.serialized_bytes, args.serialized_bytes_size = ctypes.addressof(assignment), len(assignment)
    args.serialized_device_assignment = None
    args.serialized_device_assignment_deleter = ctypes.cast(_NO_DELETE, ctypes.c_void_p).value


@implements("PJRT_LoadedExecutable_Delete")
def loaded_delete(args):
    handles.lookup(args.executable).deleted = True


@implements("PJRT_LoadedExecutable_IsDeleted")
def loaded_is_deleted(args):
    args.is_deleted = handles.lookup(args.executable).deleted


@implements("PJRT_LoadedExecutable_Fingerprint")
def loaded_fingerprint(args):
    text = handles.lookup(args.executable).executable.fingerprint
    args.executable_fingerprint, args.executable_fingerprint_size = text.address, text.size


@implements("PJRT_Executable_Destroy")
def executable_destroy(args, _release=handles.release):
    _release(args.executable)


@implements("PJRT_Executable_Name")
def executable_name(args):
    name = _executable(args.executable).name
    args.executable_name, args.executable_name_size = name.address, name.size


@implements("PJRT_Executable_NumReplicas")
def executable_num_replicas(args):
    args.num_replicas = _executable(args.executable).compiled.replicas


@implements("PJRT_Executable_NumPartitions")
def executable_num_partitions(args):
    args.num_partitions = _executable(args.executable).compiled.partitions


@implements("PJRT_Executable_NumOutputs")
def executable_num_outputs(args):
    args.num_outputs = _executable(args.executable).num_outputs


@implements("PJRT_Executable_SizeOfGeneratedCodeInBytes")
def executable_code_size(args):
    args.size_in_bytes = _executable(args.executable).compiled.code_bytes


@implements("PJRT_Executable_GetCostAnalysis")
def executable_cost_analysis(args):
    properties = _executable(args.executable).cost_properties()
    args.num_properties, args.properties = properties.count, properties.address


@implements("PJRT_Executable_GetCompiledMemoryStats")
def executable_memory_stats(args):
    stats = _executable(args.executable).memory_stats()
    for name, _ in PJRT_Executable_GetCompiledMemoryStats_Args._fields_[3:]:
        if has_field(args, name):  # jaxlib does not clear the structure: every field is written
            setattr(args, name, stats.get(name, 0))


@implements("PJRT_Executable_Fingerprint")
def executable_fingerprint(args):
    text = _executable(args.executable).fingerprint
    args.executable_fingerprint, args.executable_fingerprint_size = text.address, text.size


@implements("PJRT_Executable_OutputElementTypes")
def executable_output_types(args):
    exe = _executable(args.executable)
    args.output_types, args.num_output_types = ctypes.addressof(exe.output_types), exe.num_outputs


@implements("PJRT_Executable_OutputDimensions")
def executable_output_dimensions(args):
    exe = _executable(args.executable)
    args.num_outputs = exe.num_outputs
    args.dims, args.dim_sizes = ctypes.addressof(exe.output_dims), ctypes.addressof(exe.output_ranks)


@implements("PJRT_Executable_OutputMemoryKinds")
def executable_output_memory_kinds(args):
    exe = _executable(args.executable)
    args.num_outputs = exe.num_outputs
    args.memory_kinds, args.memory_kind_sizes = exe.memory_kinds.address, ctypes.addressof(exe.memory_kind_sizes)


@implements("PJRT_Executable_ParameterMemoryKinds")
def executable_parameter_memory_kinds(args):
    exe = _executable(args.executable)
    args.num_parameters = exe.num_inputs
    args.memory_kinds = exe.parameter_kinds.address
    args.memory_kind_sizes = ctypes.addressof(exe.parameter_kind_sizes)


@implements("PJRT_Executable_Serialize")
def executable_serialize(args):
    data = ctypes.create_string_buffer(_executable(args.executable).serialize())
    size = len(data) - 1  # create_string_buffer appends a NUL
    args.serialized_bytes, args.serialized_bytes_size = ctypes.addressof(data), size
    args.serialized_executable = handles.register(data)
    args.serialized_executable_deleter = _RELEASE_ADDRESS


@implements("PJRT_Executable_GetCompileOptions")
def executable_compile_options(args):
    data = ctypes.create_string_buffer(_executable(args.executable).compile_options)
    args.serialized_bytes, args.serialized_bytes_size = ctypes.addressof(data), len(data) - 1
    args.serialized_compile_options = handles.register(data)
    args.serialized_compile_options_deleter = _RELEASE_ADDRESS


_MLIR = Text("mlir")


@implements("PJRT_Executable_OptimizedProgram")
def executable_optimized_program(args):
    """Asked twice: for the size (``code`` NULL), then with a buffer of that size to fill."""
    program = PJRT_Program.from_address(args.program)
    code = _executable(args.executable).optimized_program()
    if program.code:
        if program.code_size < len(code):
            raise invalid(f"program buffer of {program.code_size} bytes is smaller than the {len(code)} needed")
        ctypes.memmove(program.code, code, len(code))
    program.code_size = len(code)
    program.format, program.format_size = _MLIR.address, _MLIR.size
