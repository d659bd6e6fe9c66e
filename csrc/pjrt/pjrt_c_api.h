// Our declaration of the part of the PJRT C API that torch_tpu uses, written
// from the published interface (openxla/xla: xla/pjrt/c/pjrt_c_api.h).
//
// Field order is the ABI: every struct below lists its fields in the published
// order. Args structs carry `struct_size`, which we fill from these
// declarations so a newer plugin knows which fields we know about. Function
// table slots we never call are declared as opaque pointers but keep their
// place, because the table's layout is positional.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// The oldest plugin interface we accept: every struct and table slot we use
// exists from this version on.
inline constexpr int kPjrtMinMajor = 0;
inline constexpr int kPjrtMinMinor = 54;

typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_DeviceDescription PJRT_DeviceDescription;
typedef struct PJRT_Executable PJRT_Executable;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_Buffer PJRT_Buffer;
typedef struct PJRT_ExecuteContext PJRT_ExecuteContext;
typedef struct PJRT_SerializedExecutable PJRT_SerializedExecutable;
typedef struct PJRT_Extension_Base PJRT_Extension_Base;

struct PJRT_Api_Version {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  int major_version;
  int minor_version;
};

typedef enum {
  PJRT_Error_Code_OK = 0,
  PJRT_Error_Code_CANCELLED = 1,
  PJRT_Error_Code_UNKNOWN = 2,
  PJRT_Error_Code_INVALID_ARGUMENT = 3,
  PJRT_Error_Code_DEADLINE_EXCEEDED = 4,
  PJRT_Error_Code_NOT_FOUND = 5,
  PJRT_Error_Code_ALREADY_EXISTS = 6,
  PJRT_Error_Code_PERMISSION_DENIED = 7,
  PJRT_Error_Code_RESOURCE_EXHAUSTED = 8,
  PJRT_Error_Code_FAILED_PRECONDITION = 9,
  PJRT_Error_Code_ABORTED = 10,
  PJRT_Error_Code_OUT_OF_RANGE = 11,
  PJRT_Error_Code_UNIMPLEMENTED = 12,
  PJRT_Error_Code_INTERNAL = 13,
  PJRT_Error_Code_UNAVAILABLE = 14,
  PJRT_Error_Code_DATA_LOSS = 15,
  PJRT_Error_Code_UNAUTHENTICATED = 16,
} PJRT_Error_Code;

struct PJRT_Error_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
};
struct PJRT_Error_Message_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  const char* message;
  size_t message_size;
};
struct PJRT_Error_GetCode_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  PJRT_Error_Code code;
};

typedef enum {
  PJRT_NamedValue_kString = 0,
  PJRT_NamedValue_kInt64,
  PJRT_NamedValue_kInt64List,
  PJRT_NamedValue_kFloat,
  PJRT_NamedValue_kBool,
} PJRT_NamedValue_Type;

struct PJRT_NamedValue {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* name;
  size_t name_size;
  PJRT_NamedValue_Type type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;
};

struct PJRT_Plugin_Initialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
};
struct PJRT_Plugin_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* attributes;  // out, for the process's lifetime
  size_t num_attributes;              // out
};

struct PJRT_Event_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};
struct PJRT_Event_IsReady_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
  bool is_ready;
};
struct PJRT_Event_Await_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};

struct PJRT_Client_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  void* kv_get_callback;
  void* kv_get_user_arg;
  void* kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;
  void* kv_try_get_callback;
  void* kv_try_get_user_arg;
};
struct PJRT_Client_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
};
// PlatformName and PlatformVersion share this layout.
struct PJRT_Client_String_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* value;
  size_t value_size;
};
struct PJRT_Client_AddressableDevices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
};

struct PJRT_Program {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
};
struct PJRT_Client_Compile_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;
};

typedef enum {
  PJRT_Buffer_Type_INVALID = 0,
  PJRT_Buffer_Type_PRED,
  PJRT_Buffer_Type_S8,
  PJRT_Buffer_Type_S16,
  PJRT_Buffer_Type_S32,
  PJRT_Buffer_Type_S64,
  PJRT_Buffer_Type_U8,
  PJRT_Buffer_Type_U16,
  PJRT_Buffer_Type_U32,
  PJRT_Buffer_Type_U64,
  PJRT_Buffer_Type_F16,
  PJRT_Buffer_Type_F32,
  PJRT_Buffer_Type_F64,
  PJRT_Buffer_Type_BF16,
  PJRT_Buffer_Type_C64,
  PJRT_Buffer_Type_C128,
  PJRT_Buffer_Type_F8E5M2,
  PJRT_Buffer_Type_F8E4M3FN,
} PJRT_Buffer_Type;

typedef enum {
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall = 0,
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
  PJRT_HostBufferSemantics_kImmutableZeroCopy,
  PJRT_HostBufferSemantics_kMutableZeroCopy,
} PJRT_HostBufferSemantics;

struct PJRT_Client_BufferFromHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const void* data;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;
  size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device;
  PJRT_Memory* memory;
  void* device_layout;
  PJRT_Event* done_with_host_buffer;
  PJRT_Buffer* buffer;
};

struct PJRT_DeviceDescription_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  size_t num_attributes;              // out
  const PJRT_NamedValue* attributes;  // out
};
struct PJRT_DeviceDescription_Kind_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* device_kind;
  size_t device_kind_size;
};
struct PJRT_DeviceDescription_Id_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int id;
};
struct PJRT_LoadedExecutable_AddressableDevices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_Device* const* addressable_devices;  // out
  size_t num_addressable_devices;           // out
};
struct PJRT_Buffer_CopyToDevice_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Device* dst_device;
  PJRT_Buffer* dst_buffer;  // out
};
struct PJRT_Device_GetDescription_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;
};
struct PJRT_Device_MemoryStats_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit;
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
};

struct PJRT_LoadedExecutable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
};
struct PJRT_LoadedExecutable_GetExecutable_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;
};
struct PJRT_Executable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
};
struct PJRT_Executable_NumOutputs_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
};
struct PJRT_Executable_Serialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Executable* executable;
  const char* serialized_bytes;
  size_t serialized_bytes_size;
  PJRT_SerializedExecutable* serialized_executable;
  void (*serialized_executable_deleter)(PJRT_SerializedExecutable* exec);
};
struct PJRT_Executable_DeserializeAndLoad_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
};

struct PJRT_ExecuteOptions {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  void** send_callbacks;
  void** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  PJRT_ExecuteContext* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
};
struct PJRT_LoadedExecutable_Execute_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists;
  size_t num_devices;
  size_t num_args;
  PJRT_Buffer** const* output_lists;
  PJRT_Event** device_complete_events;
  PJRT_Device* execute_device;
};

struct PJRT_Buffer_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};
struct PJRT_Buffer_ToHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src;
  void* host_layout;
  void* dst;
  size_t dst_size;
  PJRT_Event* event;
};
struct PJRT_Buffer_ReadyEvent_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Event* event;
};
struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  size_t on_device_size_in_bytes;
};

// Zero-copy interop (torch_tpu.to_dlpack / from_dlpack): a buffer's address,
// the count that keeps it from being freed or donated while another library
// reads it, and a buffer over memory someone else owns.
struct PJRT_Buffer_UnsafePointer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  uintptr_t buffer_pointer;  // out
};
struct PJRT_Buffer_IncreaseExternalReferenceCount_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};
struct PJRT_Buffer_DecreaseExternalReferenceCount_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};
struct PJRT_Client_CreateViewOfDeviceBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  void* device_buffer_ptr;
  const int64_t* dims;
  size_t num_dims;
  PJRT_Buffer_Type element_type;
  void* layout;  // PJRT_Buffer_MemoryLayout*; null: dense, major-to-minor
  PJRT_Device* device;
  void (*on_delete_callback)(void* device_buffer_ptr, void* user_arg);
  void* on_delete_callback_arg;
  intptr_t stream;
  PJRT_Buffer* buffer;  // out
};

#define TORCH_TPU_PJRT_FN(name) PJRT_Error* (*name)(name##_Args*)
typedef PJRT_Error* (*PJRT_Fn)(void*);

// The function table, in published order. Slots we do not call are `PJRT_Fn`
// placeholders named after the function that lives there.
struct PJRT_Api {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Api_Version pjrt_api_version;

  void (*PJRT_Error_Destroy)(PJRT_Error_Destroy_Args*);
  void (*PJRT_Error_Message)(PJRT_Error_Message_Args*);
  TORCH_TPU_PJRT_FN(PJRT_Error_GetCode);

  TORCH_TPU_PJRT_FN(PJRT_Plugin_Initialize);
  TORCH_TPU_PJRT_FN(PJRT_Plugin_Attributes);

  TORCH_TPU_PJRT_FN(PJRT_Event_Destroy);
  TORCH_TPU_PJRT_FN(PJRT_Event_IsReady);
  PJRT_Fn PJRT_Event_Error;
  TORCH_TPU_PJRT_FN(PJRT_Event_Await);
  PJRT_Fn PJRT_Event_OnReady;

  TORCH_TPU_PJRT_FN(PJRT_Client_Create);
  TORCH_TPU_PJRT_FN(PJRT_Client_Destroy);
  PJRT_Error* (*PJRT_Client_PlatformName)(PJRT_Client_String_Args*);
  PJRT_Fn PJRT_Client_ProcessIndex;
  PJRT_Error* (*PJRT_Client_PlatformVersion)(PJRT_Client_String_Args*);
  PJRT_Fn PJRT_Client_Devices;
  TORCH_TPU_PJRT_FN(PJRT_Client_AddressableDevices);
  PJRT_Fn PJRT_Client_LookupDevice;
  PJRT_Fn PJRT_Client_LookupAddressableDevice;
  PJRT_Fn PJRT_Client_AddressableMemories;
  TORCH_TPU_PJRT_FN(PJRT_Client_Compile);
  PJRT_Fn PJRT_Client_DefaultDeviceAssignment;
  TORCH_TPU_PJRT_FN(PJRT_Client_BufferFromHostBuffer);

  TORCH_TPU_PJRT_FN(PJRT_DeviceDescription_Id);
  PJRT_Fn PJRT_DeviceDescription_ProcessIndex;
  TORCH_TPU_PJRT_FN(PJRT_DeviceDescription_Attributes);
  TORCH_TPU_PJRT_FN(PJRT_DeviceDescription_Kind);
  PJRT_Fn PJRT_DeviceDescription_DebugString;
  PJRT_Fn PJRT_DeviceDescription_ToString;

  TORCH_TPU_PJRT_FN(PJRT_Device_GetDescription);
  PJRT_Fn PJRT_Device_IsAddressable;
  PJRT_Fn PJRT_Device_LocalHardwareId;
  PJRT_Fn PJRT_Device_AddressableMemories;
  PJRT_Fn PJRT_Device_DefaultMemory;
  TORCH_TPU_PJRT_FN(PJRT_Device_MemoryStats);

  PJRT_Fn PJRT_Memory_Id;
  PJRT_Fn PJRT_Memory_Kind;
  PJRT_Fn PJRT_Memory_DebugString;
  PJRT_Fn PJRT_Memory_ToString;
  PJRT_Fn PJRT_Memory_AddressableByDevices;

  TORCH_TPU_PJRT_FN(PJRT_Executable_Destroy);
  PJRT_Fn PJRT_Executable_Name;
  PJRT_Fn PJRT_Executable_NumReplicas;
  PJRT_Fn PJRT_Executable_NumPartitions;
  TORCH_TPU_PJRT_FN(PJRT_Executable_NumOutputs);
  PJRT_Fn PJRT_Executable_SizeOfGeneratedCodeInBytes;
  PJRT_Fn PJRT_Executable_GetCostAnalysis;
  PJRT_Fn PJRT_Executable_OutputMemoryKinds;
  PJRT_Fn PJRT_Executable_OptimizedProgram;
  TORCH_TPU_PJRT_FN(PJRT_Executable_Serialize);

  TORCH_TPU_PJRT_FN(PJRT_LoadedExecutable_Destroy);
  TORCH_TPU_PJRT_FN(PJRT_LoadedExecutable_GetExecutable);
  TORCH_TPU_PJRT_FN(PJRT_LoadedExecutable_AddressableDevices);
  PJRT_Fn PJRT_LoadedExecutable_Delete;
  PJRT_Fn PJRT_LoadedExecutable_IsDeleted;
  TORCH_TPU_PJRT_FN(PJRT_LoadedExecutable_Execute);
  TORCH_TPU_PJRT_FN(PJRT_Executable_DeserializeAndLoad);
  PJRT_Fn PJRT_LoadedExecutable_Fingerprint;

  TORCH_TPU_PJRT_FN(PJRT_Buffer_Destroy);
  PJRT_Fn PJRT_Buffer_ElementType;
  PJRT_Fn PJRT_Buffer_Dimensions;
  PJRT_Fn PJRT_Buffer_UnpaddedDimensions;
  PJRT_Fn PJRT_Buffer_DynamicDimensionIndices;
  PJRT_Fn PJRT_Buffer_GetMemoryLayout;
  TORCH_TPU_PJRT_FN(PJRT_Buffer_OnDeviceSizeInBytes);
  PJRT_Fn PJRT_Buffer_Device;
  PJRT_Fn PJRT_Buffer_Memory;
  PJRT_Fn PJRT_Buffer_Delete;
  PJRT_Fn PJRT_Buffer_IsDeleted;
  TORCH_TPU_PJRT_FN(PJRT_Buffer_CopyToDevice);
  TORCH_TPU_PJRT_FN(PJRT_Buffer_ToHostBuffer);
  PJRT_Fn PJRT_Buffer_IsOnCpu;
  TORCH_TPU_PJRT_FN(PJRT_Buffer_ReadyEvent);
  TORCH_TPU_PJRT_FN(PJRT_Buffer_UnsafePointer);
  TORCH_TPU_PJRT_FN(PJRT_Buffer_IncreaseExternalReferenceCount);
  TORCH_TPU_PJRT_FN(PJRT_Buffer_DecreaseExternalReferenceCount);
  PJRT_Fn PJRT_Buffer_OpaqueDeviceMemoryDataPointer;

  PJRT_Fn PJRT_CopyToDeviceStream_Destroy;
  PJRT_Fn PJRT_CopyToDeviceStream_AddChunk;
  PJRT_Fn PJRT_CopyToDeviceStream_TotalBytes;
  PJRT_Fn PJRT_CopyToDeviceStream_GranuleSize;
  PJRT_Fn PJRT_CopyToDeviceStream_CurrentBytes;

  PJRT_Fn PJRT_TopologyDescription_Create;
  PJRT_Fn PJRT_TopologyDescription_Destroy;
  PJRT_Fn PJRT_TopologyDescription_PlatformName;
  PJRT_Fn PJRT_TopologyDescription_PlatformVersion;
  PJRT_Fn PJRT_TopologyDescription_GetDeviceDescriptions;
  PJRT_Fn PJRT_TopologyDescription_Serialize;
  PJRT_Fn PJRT_TopologyDescription_Attributes;

  PJRT_Fn PJRT_Compile;

  // Later additions, at the end in the order they were added.
  PJRT_Fn PJRT_Executable_OutputElementTypes;
  PJRT_Fn PJRT_Executable_OutputDimensions;
  PJRT_Fn PJRT_Buffer_CopyToMemory;
  TORCH_TPU_PJRT_FN(PJRT_Client_CreateViewOfDeviceBuffer);
};

#undef TORCH_TPU_PJRT_FN

typedef const PJRT_Api* (*GetPjrtApiFn)();

}  // extern "C"
