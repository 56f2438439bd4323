from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[StatusCode]
    DOUBLE_REGISTER: _ClassVar[StatusCode]
    NO_BUFFER: _ClassVar[StatusCode]
    INVALID_STORAGE: _ClassVar[StatusCode]
    NO_REGISTER: _ClassVar[StatusCode]
    NO_PARTITION: _ClassVar[StatusCode]
    INTERNAL_ERROR: _ClassVar[StatusCode]
    TIMEOUT: _ClassVar[StatusCode]
    ACCESS_DENIED: _ClassVar[StatusCode]
    INVALID_REQUEST: _ClassVar[StatusCode]
    NO_BUFFER_FOR_HUGE_PARTITION: _ClassVar[StatusCode]
    STAGE_RETRY_IGNORE: _ClassVar[StatusCode]
    EXCEED_HUGE_PARTITION_HARD_LIMIT: _ClassVar[StatusCode]
    APP_NOT_FOUND: _ClassVar[StatusCode]
    INTERNAL_NOT_RETRY_ERROR: _ClassVar[StatusCode]

class ServerStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVE: _ClassVar[ServerStatus]
    DECOMMISSIONING: _ClassVar[ServerStatus]
    DECOMMISSIONED: _ClassVar[ServerStatus]
    LOST: _ClassVar[ServerStatus]
    UNHEALTHY: _ClassVar[ServerStatus]
    EXCLUDED: _ClassVar[ServerStatus]

class DataDistribution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NORMAL: _ClassVar[DataDistribution]
    LOCAL_ORDER: _ClassVar[DataDistribution]
SUCCESS: StatusCode
DOUBLE_REGISTER: StatusCode
NO_BUFFER: StatusCode
INVALID_STORAGE: StatusCode
NO_REGISTER: StatusCode
NO_PARTITION: StatusCode
INTERNAL_ERROR: StatusCode
TIMEOUT: StatusCode
ACCESS_DENIED: StatusCode
INVALID_REQUEST: StatusCode
NO_BUFFER_FOR_HUGE_PARTITION: StatusCode
STAGE_RETRY_IGNORE: StatusCode
EXCEED_HUGE_PARTITION_HARD_LIMIT: StatusCode
APP_NOT_FOUND: StatusCode
INTERNAL_NOT_RETRY_ERROR: StatusCode
ACTIVE: ServerStatus
DECOMMISSIONING: ServerStatus
DECOMMISSIONED: ServerStatus
LOST: ServerStatus
UNHEALTHY: ServerStatus
EXCLUDED: ServerStatus
NORMAL: DataDistribution
LOCAL_ORDER: DataDistribution

class ShufflePartitionRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class RemoteStorageConfItem(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RemoteStorage(_message.Message):
    __slots__ = ("path", "remoteStorageConf")
    PATH_FIELD_NUMBER: _ClassVar[int]
    REMOTESTORAGECONF_FIELD_NUMBER: _ClassVar[int]
    path: str
    remoteStorageConf: _containers.RepeatedCompositeFieldContainer[RemoteStorageConfItem]
    def __init__(self, path: _Optional[str] = ..., remoteStorageConf: _Optional[_Iterable[_Union[RemoteStorageConfItem, _Mapping]]] = ...) -> None: ...

class MergeContext(_message.Message):
    __slots__ = ("keyClass", "valueClass", "comparatorClass", "mergedBlockSize", "mergeClassLoader")
    KEYCLASS_FIELD_NUMBER: _ClassVar[int]
    VALUECLASS_FIELD_NUMBER: _ClassVar[int]
    COMPARATORCLASS_FIELD_NUMBER: _ClassVar[int]
    MERGEDBLOCKSIZE_FIELD_NUMBER: _ClassVar[int]
    MERGECLASSLOADER_FIELD_NUMBER: _ClassVar[int]
    keyClass: str
    valueClass: str
    comparatorClass: str
    mergedBlockSize: int
    mergeClassLoader: str
    def __init__(self, keyClass: _Optional[str] = ..., valueClass: _Optional[str] = ..., comparatorClass: _Optional[str] = ..., mergedBlockSize: _Optional[int] = ..., mergeClassLoader: _Optional[str] = ...) -> None: ...

class ShuffleRegisterRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionRanges", "remoteStorage", "user", "shuffleDataDistribution", "maxConcurrencyPerPartitionToWrite", "mergeContext", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONRANGES_FIELD_NUMBER: _ClassVar[int]
    REMOTESTORAGE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEDATADISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    MAXCONCURRENCYPERPARTITIONTOWRITE_FIELD_NUMBER: _ClassVar[int]
    MERGECONTEXT_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionRanges: _containers.RepeatedCompositeFieldContainer[ShufflePartitionRange]
    remoteStorage: RemoteStorage
    user: str
    shuffleDataDistribution: DataDistribution
    maxConcurrencyPerPartitionToWrite: int
    mergeContext: MergeContext
    properties: _containers.ScalarMap[str, str]
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionRanges: _Optional[_Iterable[_Union[ShufflePartitionRange, _Mapping]]] = ..., remoteStorage: _Optional[_Union[RemoteStorage, _Mapping]] = ..., user: _Optional[str] = ..., shuffleDataDistribution: _Optional[_Union[DataDistribution, str]] = ..., maxConcurrencyPerPartitionToWrite: _Optional[int] = ..., mergeContext: _Optional[_Union[MergeContext, _Mapping]] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ShuffleRegisterResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class ShuffleUnregisterRequest(_message.Message):
    __slots__ = ("appId", "shuffleId")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ...) -> None: ...

class ShuffleUnregisterResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class ShuffleUnregisterByAppIdRequest(_message.Message):
    __slots__ = ("appId",)
    APPID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    def __init__(self, appId: _Optional[str] = ...) -> None: ...

class ShuffleUnregisterByAppIdResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class ShuffleBlock(_message.Message):
    __slots__ = ("blockId", "length", "uncompressLength", "crc", "data", "taskAttemptId")
    BLOCKID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSLENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TASKATTEMPTID_FIELD_NUMBER: _ClassVar[int]
    blockId: int
    length: int
    uncompressLength: int
    crc: int
    data: bytes
    taskAttemptId: int
    def __init__(self, blockId: _Optional[int] = ..., length: _Optional[int] = ..., uncompressLength: _Optional[int] = ..., crc: _Optional[int] = ..., data: _Optional[bytes] = ..., taskAttemptId: _Optional[int] = ...) -> None: ...

class ShuffleData(_message.Message):
    __slots__ = ("partitionId", "block")
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    partitionId: int
    block: _containers.RepeatedCompositeFieldContainer[ShuffleBlock]
    def __init__(self, partitionId: _Optional[int] = ..., block: _Optional[_Iterable[_Union[ShuffleBlock, _Mapping]]] = ...) -> None: ...

class CombinedShuffleData(_message.Message):
    __slots__ = ("partition_ids", "partition_block_counts", "block_ids", "lengths", "uncompress_lengths", "crcs", "task_attempt_ids", "combined_data")
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_BLOCK_COUNTS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESS_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CRCS_FIELD_NUMBER: _ClassVar[int]
    TASK_ATTEMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    COMBINED_DATA_FIELD_NUMBER: _ClassVar[int]
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    partition_block_counts: _containers.RepeatedScalarFieldContainer[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    uncompress_lengths: _containers.RepeatedScalarFieldContainer[int]
    crcs: _containers.RepeatedScalarFieldContainer[int]
    task_attempt_ids: _containers.RepeatedScalarFieldContainer[int]
    combined_data: bytes
    def __init__(self, partition_ids: _Optional[_Iterable[int]] = ..., partition_block_counts: _Optional[_Iterable[int]] = ..., block_ids: _Optional[_Iterable[int]] = ..., lengths: _Optional[_Iterable[int]] = ..., uncompress_lengths: _Optional[_Iterable[int]] = ..., crcs: _Optional[_Iterable[int]] = ..., task_attempt_ids: _Optional[_Iterable[int]] = ..., combined_data: _Optional[bytes] = ...) -> None: ...

class SendShuffleDataRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "requireBufferId", "shuffleData", "timestamp", "stageAttemptNumber", "combinedShuffleData")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    REQUIREBUFFERID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEDATA_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STAGEATTEMPTNUMBER_FIELD_NUMBER: _ClassVar[int]
    COMBINEDSHUFFLEDATA_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    requireBufferId: int
    shuffleData: _containers.RepeatedCompositeFieldContainer[ShuffleData]
    timestamp: int
    stageAttemptNumber: int
    combinedShuffleData: CombinedShuffleData
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., requireBufferId: _Optional[int] = ..., shuffleData: _Optional[_Iterable[_Union[ShuffleData, _Mapping]]] = ..., timestamp: _Optional[int] = ..., stageAttemptNumber: _Optional[int] = ..., combinedShuffleData: _Optional[_Union[CombinedShuffleData, _Mapping]] = ...) -> None: ...

class SendShuffleDataResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class RequireBufferRequest(_message.Message):
    __slots__ = ("requireSize", "appId", "shuffleId", "partitionIds", "partitionRequireSizes")
    REQUIRESIZE_FIELD_NUMBER: _ClassVar[int]
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONIDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONREQUIRESIZES_FIELD_NUMBER: _ClassVar[int]
    requireSize: int
    appId: str
    shuffleId: int
    partitionIds: _containers.RepeatedScalarFieldContainer[int]
    partitionRequireSizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, requireSize: _Optional[int] = ..., appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionIds: _Optional[_Iterable[int]] = ..., partitionRequireSizes: _Optional[_Iterable[int]] = ...) -> None: ...

class RequireBufferResponse(_message.Message):
    __slots__ = ("requireBufferId", "status", "retMsg", "needSplitPartitionIds")
    REQUIREBUFFERID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    NEEDSPLITPARTITIONIDS_FIELD_NUMBER: _ClassVar[int]
    requireBufferId: int
    status: StatusCode
    retMsg: str
    needSplitPartitionIds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, requireBufferId: _Optional[int] = ..., status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., needSplitPartitionIds: _Optional[_Iterable[int]] = ...) -> None: ...

class GetLocalShuffleIndexRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionId", "partitionNumPerRange", "partitionNum")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUMPERRANGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUM_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionId: int
    partitionNumPerRange: int
    partitionNum: int
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionId: _Optional[int] = ..., partitionNumPerRange: _Optional[int] = ..., partitionNum: _Optional[int] = ...) -> None: ...

class GetLocalShuffleIndexResponse(_message.Message):
    __slots__ = ("indexData", "status", "retMsg", "dataFileLen", "storageIds")
    INDEXDATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    DATAFILELEN_FIELD_NUMBER: _ClassVar[int]
    STORAGEIDS_FIELD_NUMBER: _ClassVar[int]
    indexData: bytes
    status: StatusCode
    retMsg: str
    dataFileLen: int
    storageIds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, indexData: _Optional[bytes] = ..., status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., dataFileLen: _Optional[int] = ..., storageIds: _Optional[_Iterable[int]] = ...) -> None: ...

class ReadSegment(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class GetLocalShuffleDataRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionId", "partitionNumPerRange", "partitionNum", "offset", "length", "timestamp", "storageId", "nextReadSegments")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUMPERRANGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STORAGEID_FIELD_NUMBER: _ClassVar[int]
    NEXTREADSEGMENTS_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionId: int
    partitionNumPerRange: int
    partitionNum: int
    offset: int
    length: int
    timestamp: int
    storageId: int
    nextReadSegments: _containers.RepeatedCompositeFieldContainer[ReadSegment]
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionId: _Optional[int] = ..., partitionNumPerRange: _Optional[int] = ..., partitionNum: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., timestamp: _Optional[int] = ..., storageId: _Optional[int] = ..., nextReadSegments: _Optional[_Iterable[_Union[ReadSegment, _Mapping]]] = ...) -> None: ...

class GetLocalShuffleDataResponse(_message.Message):
    __slots__ = ("data", "status", "retMsg")
    DATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    status: StatusCode
    retMsg: str
    def __init__(self, data: _Optional[bytes] = ..., status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class GetMemoryShuffleDataRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionId", "lastBlockId", "readBufferSize", "timestamp", "serializedExpectedTaskIdsBitmap")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    LASTBLOCKID_FIELD_NUMBER: _ClassVar[int]
    READBUFFERSIZE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SERIALIZEDEXPECTEDTASKIDSBITMAP_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionId: int
    lastBlockId: int
    readBufferSize: int
    timestamp: int
    serializedExpectedTaskIdsBitmap: bytes
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionId: _Optional[int] = ..., lastBlockId: _Optional[int] = ..., readBufferSize: _Optional[int] = ..., timestamp: _Optional[int] = ..., serializedExpectedTaskIdsBitmap: _Optional[bytes] = ...) -> None: ...

class ShuffleDataBlockSegment(_message.Message):
    __slots__ = ("blockId", "offset", "length", "uncompressLength", "crc", "taskAttemptId")
    BLOCKID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSLENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    TASKATTEMPTID_FIELD_NUMBER: _ClassVar[int]
    blockId: int
    offset: int
    length: int
    uncompressLength: int
    crc: int
    taskAttemptId: int
    def __init__(self, blockId: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., uncompressLength: _Optional[int] = ..., crc: _Optional[int] = ..., taskAttemptId: _Optional[int] = ...) -> None: ...

class GetMemoryShuffleDataResponse(_message.Message):
    __slots__ = ("shuffleDataBlockSegments", "data", "status", "retMsg")
    SHUFFLEDATABLOCKSEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    shuffleDataBlockSegments: _containers.RepeatedCompositeFieldContainer[ShuffleDataBlockSegment]
    data: bytes
    status: StatusCode
    retMsg: str
    def __init__(self, shuffleDataBlockSegments: _Optional[_Iterable[_Union[ShuffleDataBlockSegment, _Mapping]]] = ..., data: _Optional[bytes] = ..., status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class ShuffleCommitRequest(_message.Message):
    __slots__ = ("appId", "shuffleId")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ...) -> None: ...

class ShuffleCommitResponse(_message.Message):
    __slots__ = ("commitCount", "status", "retMsg")
    COMMITCOUNT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    commitCount: int
    status: StatusCode
    retMsg: str
    def __init__(self, commitCount: _Optional[int] = ..., status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class FinishShuffleRequest(_message.Message):
    __slots__ = ("appId", "shuffleId")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ...) -> None: ...

class FinishShuffleResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class PartitionToBlockIds(_message.Message):
    __slots__ = ("partitionId", "blockIds")
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    BLOCKIDS_FIELD_NUMBER: _ClassVar[int]
    partitionId: int
    blockIds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partitionId: _Optional[int] = ..., blockIds: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportShuffleResultRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "taskAttemptId", "bitmapNum", "partitionToBlockIds")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    TASKATTEMPTID_FIELD_NUMBER: _ClassVar[int]
    BITMAPNUM_FIELD_NUMBER: _ClassVar[int]
    PARTITIONTOBLOCKIDS_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    taskAttemptId: int
    bitmapNum: int
    partitionToBlockIds: _containers.RepeatedCompositeFieldContainer[PartitionToBlockIds]
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., taskAttemptId: _Optional[int] = ..., bitmapNum: _Optional[int] = ..., partitionToBlockIds: _Optional[_Iterable[_Union[PartitionToBlockIds, _Mapping]]] = ...) -> None: ...

class ReportShuffleResultResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class BlockIdLayout(_message.Message):
    __slots__ = ("sequenceNoBits", "partitionIdBits", "taskAttemptIdBits")
    SEQUENCENOBITS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONIDBITS_FIELD_NUMBER: _ClassVar[int]
    TASKATTEMPTIDBITS_FIELD_NUMBER: _ClassVar[int]
    sequenceNoBits: int
    partitionIdBits: int
    taskAttemptIdBits: int
    def __init__(self, sequenceNoBits: _Optional[int] = ..., partitionIdBits: _Optional[int] = ..., taskAttemptIdBits: _Optional[int] = ...) -> None: ...

class GetShuffleResultRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionId", "blockIdLayout")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    BLOCKIDLAYOUT_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionId: int
    blockIdLayout: BlockIdLayout
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionId: _Optional[int] = ..., blockIdLayout: _Optional[_Union[BlockIdLayout, _Mapping]] = ...) -> None: ...

class GetShuffleResultResponse(_message.Message):
    __slots__ = ("status", "retMsg", "serializedBitmap")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    SERIALIZEDBITMAP_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    serializedBitmap: bytes
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., serializedBitmap: _Optional[bytes] = ...) -> None: ...

class GetShuffleResultForMultiPartRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitions", "blockIdLayout")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BLOCKIDLAYOUT_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    blockIdLayout: BlockIdLayout
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., blockIdLayout: _Optional[_Union[BlockIdLayout, _Mapping]] = ...) -> None: ...

class GetShuffleResultForMultiPartResponse(_message.Message):
    __slots__ = ("status", "retMsg", "serializedBitmap")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    SERIALIZEDBITMAP_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    serializedBitmap: bytes
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., serializedBitmap: _Optional[bytes] = ...) -> None: ...

class AppHeartBeatRequest(_message.Message):
    __slots__ = ("appId",)
    APPID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    def __init__(self, appId: _Optional[str] = ...) -> None: ...

class AppHeartBeatResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class StartSortMergeRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionId", "uniqueBlocksBitmap")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    UNIQUEBLOCKSBITMAP_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionId: int
    uniqueBlocksBitmap: bytes
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionId: _Optional[int] = ..., uniqueBlocksBitmap: _Optional[bytes] = ...) -> None: ...

class StartSortMergeResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class GetSortedShuffleDataRequest(_message.Message):
    __slots__ = ("appId", "shuffleId", "partitionId", "mergedBlockId", "timestamp")
    APPID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONID_FIELD_NUMBER: _ClassVar[int]
    MERGEDBLOCKID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    appId: str
    shuffleId: int
    partitionId: int
    mergedBlockId: int
    timestamp: int
    def __init__(self, appId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionId: _Optional[int] = ..., mergedBlockId: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class GetSortedShuffleDataResponse(_message.Message):
    __slots__ = ("data", "status", "retMsg", "nextBlockId", "mState")
    DATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    NEXTBLOCKID_FIELD_NUMBER: _ClassVar[int]
    MSTATE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    status: StatusCode
    retMsg: str
    nextBlockId: int
    mState: int
    def __init__(self, data: _Optional[bytes] = ..., status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., nextBlockId: _Optional[int] = ..., mState: _Optional[int] = ...) -> None: ...

class ShuffleServerId(_message.Message):
    __slots__ = ("id", "ip", "port", "netty_port", "jetty_port")
    ID_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NETTY_PORT_FIELD_NUMBER: _ClassVar[int]
    JETTY_PORT_FIELD_NUMBER: _ClassVar[int]
    id: str
    ip: str
    port: int
    netty_port: int
    jetty_port: int
    def __init__(self, id: _Optional[str] = ..., ip: _Optional[str] = ..., port: _Optional[int] = ..., netty_port: _Optional[int] = ..., jetty_port: _Optional[int] = ...) -> None: ...

class StorageInfo(_message.Message):
    __slots__ = ("mountPoint", "storageMedia", "capacity", "usedBytes", "writingSpeed1M", "writingSpeed5M", "writingSpeed1H", "numOfWritingFailures", "status")
    class StorageMedia(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STORAGE_TYPE_UNKNOWN: _ClassVar[StorageInfo.StorageMedia]
        HDD: _ClassVar[StorageInfo.StorageMedia]
        SSD: _ClassVar[StorageInfo.StorageMedia]
        HDFS: _ClassVar[StorageInfo.StorageMedia]
        OBJECT_STORE: _ClassVar[StorageInfo.StorageMedia]
    STORAGE_TYPE_UNKNOWN: StorageInfo.StorageMedia
    HDD: StorageInfo.StorageMedia
    SSD: StorageInfo.StorageMedia
    HDFS: StorageInfo.StorageMedia
    OBJECT_STORE: StorageInfo.StorageMedia
    class StorageStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STORAGE_STATUS_UNKNOWN: _ClassVar[StorageInfo.StorageStatus]
        NORMAL: _ClassVar[StorageInfo.StorageStatus]
        UNHEALTHY: _ClassVar[StorageInfo.StorageStatus]
        OVERUSED: _ClassVar[StorageInfo.StorageStatus]
    STORAGE_STATUS_UNKNOWN: StorageInfo.StorageStatus
    NORMAL: StorageInfo.StorageStatus
    UNHEALTHY: StorageInfo.StorageStatus
    OVERUSED: StorageInfo.StorageStatus
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    STORAGEMEDIA_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USEDBYTES_FIELD_NUMBER: _ClassVar[int]
    WRITINGSPEED1M_FIELD_NUMBER: _ClassVar[int]
    WRITINGSPEED5M_FIELD_NUMBER: _ClassVar[int]
    WRITINGSPEED1H_FIELD_NUMBER: _ClassVar[int]
    NUMOFWRITINGFAILURES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    mountPoint: str
    storageMedia: StorageInfo.StorageMedia
    capacity: int
    usedBytes: int
    writingSpeed1M: int
    writingSpeed5M: int
    writingSpeed1H: int
    numOfWritingFailures: int
    status: StorageInfo.StorageStatus
    def __init__(self, mountPoint: _Optional[str] = ..., storageMedia: _Optional[_Union[StorageInfo.StorageMedia, str]] = ..., capacity: _Optional[int] = ..., usedBytes: _Optional[int] = ..., writingSpeed1M: _Optional[int] = ..., writingSpeed5M: _Optional[int] = ..., writingSpeed1H: _Optional[int] = ..., numOfWritingFailures: _Optional[int] = ..., status: _Optional[_Union[StorageInfo.StorageStatus, str]] = ...) -> None: ...

class ApplicationInfo(_message.Message):
    __slots__ = ("appId", "partitionNum", "memorySize", "localFileNum", "localTotalSize", "hadoopFileNum", "hadoopTotalSize", "totalSize")
    APPID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUM_FIELD_NUMBER: _ClassVar[int]
    MEMORYSIZE_FIELD_NUMBER: _ClassVar[int]
    LOCALFILENUM_FIELD_NUMBER: _ClassVar[int]
    LOCALTOTALSIZE_FIELD_NUMBER: _ClassVar[int]
    HADOOPFILENUM_FIELD_NUMBER: _ClassVar[int]
    HADOOPTOTALSIZE_FIELD_NUMBER: _ClassVar[int]
    TOTALSIZE_FIELD_NUMBER: _ClassVar[int]
    appId: str
    partitionNum: int
    memorySize: int
    localFileNum: int
    localTotalSize: int
    hadoopFileNum: int
    hadoopTotalSize: int
    totalSize: int
    def __init__(self, appId: _Optional[str] = ..., partitionNum: _Optional[int] = ..., memorySize: _Optional[int] = ..., localFileNum: _Optional[int] = ..., localTotalSize: _Optional[int] = ..., hadoopFileNum: _Optional[int] = ..., hadoopTotalSize: _Optional[int] = ..., totalSize: _Optional[int] = ...) -> None: ...

class ShuffleServerHeartBeatRequest(_message.Message):
    __slots__ = ("serverId", "usedMemory", "preAllocatedMemory", "availableMemory", "eventNumInFlush", "tags", "isHealthy", "status", "storageInfo", "version", "gitCommitId", "startTimeMs", "applicationInfo", "displayMetrics")
    class StorageInfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StorageInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StorageInfo, _Mapping]] = ...) -> None: ...
    class DisplayMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SERVERID_FIELD_NUMBER: _ClassVar[int]
    USEDMEMORY_FIELD_NUMBER: _ClassVar[int]
    PREALLOCATEDMEMORY_FIELD_NUMBER: _ClassVar[int]
    AVAILABLEMEMORY_FIELD_NUMBER: _ClassVar[int]
    EVENTNUMINFLUSH_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    ISHEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STORAGEINFO_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GITCOMMITID_FIELD_NUMBER: _ClassVar[int]
    STARTTIMEMS_FIELD_NUMBER: _ClassVar[int]
    APPLICATIONINFO_FIELD_NUMBER: _ClassVar[int]
    DISPLAYMETRICS_FIELD_NUMBER: _ClassVar[int]
    serverId: ShuffleServerId
    usedMemory: int
    preAllocatedMemory: int
    availableMemory: int
    eventNumInFlush: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    isHealthy: _wrappers_pb2.BoolValue
    status: ServerStatus
    storageInfo: _containers.MessageMap[str, StorageInfo]
    version: str
    gitCommitId: str
    startTimeMs: int
    applicationInfo: _containers.RepeatedCompositeFieldContainer[ApplicationInfo]
    displayMetrics: _containers.ScalarMap[str, str]
    def __init__(self, serverId: _Optional[_Union[ShuffleServerId, _Mapping]] = ..., usedMemory: _Optional[int] = ..., preAllocatedMemory: _Optional[int] = ..., availableMemory: _Optional[int] = ..., eventNumInFlush: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., isHealthy: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., status: _Optional[_Union[ServerStatus, str]] = ..., storageInfo: _Optional[_Mapping[str, StorageInfo]] = ..., version: _Optional[str] = ..., gitCommitId: _Optional[str] = ..., startTimeMs: _Optional[int] = ..., applicationInfo: _Optional[_Iterable[_Union[ApplicationInfo, _Mapping]]] = ..., displayMetrics: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ShuffleServerHeartBeatResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class GetShuffleServerListResponse(_message.Message):
    __slots__ = ("servers",)
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[ShuffleServerId]
    def __init__(self, servers: _Optional[_Iterable[_Union[ShuffleServerId, _Mapping]]] = ...) -> None: ...

class GetShuffleServerNumResponse(_message.Message):
    __slots__ = ("num",)
    NUM_FIELD_NUMBER: _ClassVar[int]
    num: int
    def __init__(self, num: _Optional[int] = ...) -> None: ...

class GetShuffleServerRequest(_message.Message):
    __slots__ = ("clientHost", "clientPort", "clientProperty", "applicationId", "shuffleId", "partitionNum", "partitionNumPerRange", "dataReplica", "requireTags", "assignmentShuffleServerNumber", "estimateTaskConcurrency", "faultyServerIds")
    CLIENTHOST_FIELD_NUMBER: _ClassVar[int]
    CLIENTPORT_FIELD_NUMBER: _ClassVar[int]
    CLIENTPROPERTY_FIELD_NUMBER: _ClassVar[int]
    APPLICATIONID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLEID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUM_FIELD_NUMBER: _ClassVar[int]
    PARTITIONNUMPERRANGE_FIELD_NUMBER: _ClassVar[int]
    DATAREPLICA_FIELD_NUMBER: _ClassVar[int]
    REQUIRETAGS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTSHUFFLESERVERNUMBER_FIELD_NUMBER: _ClassVar[int]
    ESTIMATETASKCONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    FAULTYSERVERIDS_FIELD_NUMBER: _ClassVar[int]
    clientHost: str
    clientPort: str
    clientProperty: str
    applicationId: str
    shuffleId: int
    partitionNum: int
    partitionNumPerRange: int
    dataReplica: int
    requireTags: _containers.RepeatedScalarFieldContainer[str]
    assignmentShuffleServerNumber: int
    estimateTaskConcurrency: int
    faultyServerIds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, clientHost: _Optional[str] = ..., clientPort: _Optional[str] = ..., clientProperty: _Optional[str] = ..., applicationId: _Optional[str] = ..., shuffleId: _Optional[int] = ..., partitionNum: _Optional[int] = ..., partitionNumPerRange: _Optional[int] = ..., dataReplica: _Optional[int] = ..., requireTags: _Optional[_Iterable[str]] = ..., assignmentShuffleServerNumber: _Optional[int] = ..., estimateTaskConcurrency: _Optional[int] = ..., faultyServerIds: _Optional[_Iterable[str]] = ...) -> None: ...

class PartitionRangeAssignment(_message.Message):
    __slots__ = ("startPartition", "endPartition", "server")
    STARTPARTITION_FIELD_NUMBER: _ClassVar[int]
    ENDPARTITION_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    startPartition: int
    endPartition: int
    server: _containers.RepeatedCompositeFieldContainer[ShuffleServerId]
    def __init__(self, startPartition: _Optional[int] = ..., endPartition: _Optional[int] = ..., server: _Optional[_Iterable[_Union[ShuffleServerId, _Mapping]]] = ...) -> None: ...

class GetShuffleAssignmentsResponse(_message.Message):
    __slots__ = ("status", "assignments", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    assignments: _containers.RepeatedCompositeFieldContainer[PartitionRangeAssignment]
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., assignments: _Optional[_Iterable[_Union[PartitionRangeAssignment, _Mapping]]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class GetShuffleDataStorageInfoResponse(_message.Message):
    __slots__ = ("storage", "storagePath", "storagePattern")
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    STORAGEPATH_FIELD_NUMBER: _ClassVar[int]
    STORAGEPATTERN_FIELD_NUMBER: _ClassVar[int]
    storage: str
    storagePath: str
    storagePattern: str
    def __init__(self, storage: _Optional[str] = ..., storagePath: _Optional[str] = ..., storagePattern: _Optional[str] = ...) -> None: ...

class CheckServiceAvailableResponse(_message.Message):
    __slots__ = ("status", "available")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    available: bool
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., available: _Optional[bool] = ...) -> None: ...

class ReportShuffleClientOpRequest(_message.Message):
    __slots__ = ("clientHost", "clientPort", "server", "operation")
    CLIENTHOST_FIELD_NUMBER: _ClassVar[int]
    CLIENTPORT_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    clientHost: str
    clientPort: int
    server: ShuffleServerId
    operation: str
    def __init__(self, clientHost: _Optional[str] = ..., clientPort: _Optional[int] = ..., server: _Optional[_Union[ShuffleServerId, _Mapping]] = ..., operation: _Optional[str] = ...) -> None: ...

class ReportShuffleClientOpResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class ApplicationInfoRequest(_message.Message):
    __slots__ = ("appId", "user", "version", "gitCommitId")
    APPID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GITCOMMITID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    user: str
    version: str
    gitCommitId: str
    def __init__(self, appId: _Optional[str] = ..., user: _Optional[str] = ..., version: _Optional[str] = ..., gitCommitId: _Optional[str] = ...) -> None: ...

class ApplicationInfoResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class AccessClusterRequest(_message.Message):
    __slots__ = ("accessId", "tags", "extraProperties", "user")
    class ExtraPropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ACCESSID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    EXTRAPROPERTIES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    accessId: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    extraProperties: _containers.ScalarMap[str, str]
    user: str
    def __init__(self, accessId: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., extraProperties: _Optional[_Mapping[str, str]] = ..., user: _Optional[str] = ...) -> None: ...

class AccessClusterResponse(_message.Message):
    __slots__ = ("status", "retMsg", "uuid")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    uuid: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., uuid: _Optional[str] = ...) -> None: ...

class FetchClientConfRequest(_message.Message):
    __slots__ = ("user", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    USER_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    user: str
    properties: _containers.ScalarMap[str, str]
    def __init__(self, user: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClientConfItem(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class FetchClientConfResponse(_message.Message):
    __slots__ = ("status", "retMsg", "clientConf")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    CLIENTCONF_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    clientConf: _containers.RepeatedCompositeFieldContainer[ClientConfItem]
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ..., clientConf: _Optional[_Iterable[_Union[ClientConfItem, _Mapping]]] = ...) -> None: ...

class FetchRemoteStorageRequest(_message.Message):
    __slots__ = ("appId",)
    APPID_FIELD_NUMBER: _ClassVar[int]
    appId: str
    def __init__(self, appId: _Optional[str] = ...) -> None: ...

class FetchRemoteStorageResponse(_message.Message):
    __slots__ = ("status", "remoteStorage")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REMOTESTORAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    remoteStorage: RemoteStorage
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., remoteStorage: _Optional[_Union[RemoteStorage, _Mapping]] = ...) -> None: ...

class DecommissionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DecommissionResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...

class CancelDecommissionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CancelDecommissionResponse(_message.Message):
    __slots__ = ("status", "retMsg")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETMSG_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    retMsg: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., retMsg: _Optional[str] = ...) -> None: ...
